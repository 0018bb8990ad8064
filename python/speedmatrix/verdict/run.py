"""Judgements over several cells: one status for a cell's repetitions, and the exit status
of a finished run.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

import numpy as np

from speedmatrix.values import missing
from speedmatrix.verdict.names import REPORTED, Status

__all__ = ["ExitStatus", "combined_status", "error_kind", "exit_status", "reported_flags"]


class ExitStatus(IntEnum):
    """The process exit status of a finished (not interrupted) run."""

    OK = 0
    #: nothing was measured
    FAILURE = 1
    #: some cells failed or were not run, or a context could not be run at all
    PARTIAL = 3


def combined_status(statuses: Iterable[str | None]) -> str:
    """One status for a cell's repetitions: over capacity wins, then all-error, then queued,
    then any error; no status at all reads valid."""
    s = [x for x in statuses if x]
    if not s:
        return Status.VALID.value
    if Status.OVER_CAPACITY in s:
        return Status.OVER_CAPACITY.value
    if all(x == Status.ERROR for x in s):
        return Status.ERROR.value
    if Status.QUEUED in s:
        return Status.QUEUED.value
    if Status.ERROR in s:
        return Status.ERROR.value
    return Status.VALID.value


def exit_status(doc: dict) -> ExitStatus:
    """The exit status of a finished (not interrupted) run, from its saved cells: OK when
    every runnable cell was measured (valid or queued), PARTIAL when some failed or were
    not run, or when a decode context could not be run at any concurrency (every cell of
    it over capacity: the server cannot serve that context at all, so what was asked was
    not measured), FAILURE when none was measured. Over-capacity cells beside measured
    ones of their context are the matrix's edge, not a failure."""
    all_cells = doc.get("cells") or []
    cells = [c for c in all_cells if c.get("status") != Status.OVER_CAPACITY]
    measured = [c for c in cells if c.get("status") in REPORTED and not c.get("not_run")]
    if not measured:
        return ExitStatus.FAILURE
    by_context: dict[object, list[str]] = {}
    for c in all_cells:
        if c.get("phase") == "decode" and c.get("context") is not None:
            by_context.setdefault(c.get("context"), []).append(str(c.get("status")))
    refused = [k for k, st in by_context.items() if all(s == Status.OVER_CAPACITY for s in st)]
    if len(measured) == len(cells) and not refused:
        return ExitStatus.OK
    return ExitStatus.PARTIAL


def reported_flags(cells: Iterable[dict]) -> list[str]:
    """The flags of a matrix cell's reported repetitions (valid and queued), in first-seen
    order: what the report lists beside the cell's figures."""
    out: list[str] = []
    for c in cells:
        if c.get("status") not in REPORTED:
            continue
        flags = c.get("flags")
        for f in list(flags) if isinstance(flags, (list, tuple, np.ndarray)) else []:
            if str(f) not in out:
                out.append(str(f))
    return out


def error_kind(cells: Iterable[dict]) -> str:
    """Why a matrix cell (its repetitions) is `error`: ``not_run`` (the server stopped
    answering before it), ``failed`` (it ran and too many of its requests failed) or
    ``unmeasured`` (it could not be measured at all: no prompts, no window, no output)."""
    cells = list(cells)
    if any(not missing(c.get("not_run")) for c in cells):
        return "not_run"
    for c in cells:
        errs, measured = c.get("errors_total"), c.get("measured_s")
        ran = not missing(measured) and float(measured or 0) > 0
        if errs is not None and not missing(errs) and int(errs) > 0 and ran:
            return "failed"
    return "unmeasured"
