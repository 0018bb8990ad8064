"""Rebuilding a saved run's cells from their raw records (``speedmatrix recompute``).

Every measured cell (one with a ``records`` file) is judged again by
`speedmatrix.verdict` from its records, the engine facts and the rules saved in
``meta["verdict"]`` (optionally with other thresholds). What the records cannot
hold is kept from the stored cell: whether the server was idle before it
(``busy_at_start``), how its prompts were made exact, which decode cell measured a
prefill, the records path. Cells without records (over capacity, not run, prompts
that could not be made) are kept as they are.

A run saved before ``meta["verdict"]`` existed is read as today's by
`speedmatrix.verdict.upgrade` (default rules, the facts its cells and records show) and
its records without clock stamps take the cell's own: `notes` says so.

This is the only way a saved run is judged again: the report reads the stored
judgements (`speedmatrix.verdict.reported_flags`, ``cell["status"]``) and makes none.
"""

from __future__ import annotations

import copy
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedmatrix import runfile, slo, verdict
from speedmatrix.records import Records
from speedmatrix.verdict import CellShape, EngineFacts, Flag, Rules
from speedmatrix.verdict.interference import interference_cell
from speedmatrix.verdict.sessions import session_cell
from speedmatrix.verdict.upgrade import facts_of, rules_of

#: the phases of cells judged from their records
_PHASES = ("prefill", "decode", "interference", "session")

__all__ = ["Recomputed", "facts_of", "recompute_doc", "rules_of", "slo_judged_doc"]


@dataclass
class Recomputed:
    """A recomputed run document and what the recomputation had to assume."""

    doc: dict
    notes: list[str] = field(default_factory=list)
    #: ids of the cells whose stored form changed
    changed: list[str] = field(default_factory=list)


def recompute_doc(
    doc: dict,
    run_dir: str | os.PathLike,
    rules: Rules | None = None,
    changes: dict[str, Any] | None = None,
) -> Recomputed:
    """A copy of the saved run ``doc`` (as `runfile.read_run` gives it) with every
    measured cell rebuilt from its records in ``run_dir``. ``rules`` replaces the saved
    rules; ``changes`` ({name: value}) changes some of them (KeyError on an unknown name).
    The result is in stored form (`runfile.as_saved`): equal to ``doc`` when nothing
    changed."""
    run_dir = Path(run_dir)
    out = copy.deepcopy(doc)
    notes: list[str] = []
    saved_rules, note = rules_of(doc)
    if note and rules is None:
        notes.append(note)
    use = rules or saved_rules
    if changes:
        use = use.replace(**changes)
    facts, note = facts_of(doc, run_dir)
    if note:
        notes.append(note)
    old_stamps = 0
    cells = []
    # the host's client roofline the run started with (`speedmatrix selftest`; None: none)
    roofline = (doc.get("meta") or {}).get("client_roofline")
    for cell in out.get("cells") or []:
        rel = cell.get("records")
        if not rel or cell.get("status") is None or cell.get("phase") not in _PHASES:
            cells.append(cell)
            continue
        try:
            records = Records.from_saved(run_dir, cell)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            notes.append(f"{cell.get('id')}: records unreadable ({exc}); kept as saved")
            cells.append(cell)
            continue
        old_stamps += records.stamps_from_cell
        cells.append(_rejudge(cell, records, facts, use, roofline))
    if old_stamps:
        notes.append(
            f"{old_stamps} cells' records were saved without their clock stamps: the "
            "window comes from the cell; a transport's fatal error, not saved, is not "
            "in their reasons"
        )
    out["cells"] = cells
    meta = out.setdefault("meta", {})
    meta["verdict"] = {"facts": facts.to_dict(), "rules": use.to_dict()}
    new = runfile.as_saved(out)
    old_cells = {c.get("id"): c for c in runfile.as_saved(doc).get("cells") or []}
    changed = [c.get("id") for c in new["cells"] if old_cells.get(c.get("id")) != c]
    return Recomputed(new, notes, changed)


def _rejudge(
    cell: dict, records: Records, facts: EngineFacts, rules: Rules, roofline: dict | None = None
) -> dict:
    shape = CellShape.from_cell(cell)
    idle = Flag.BUSY_AT_START not in (cell.get("flags") or [])
    if cell["phase"] == "decode":
        # the latency percentiles and SLO the cell was judged with, as it stored them
        new = verdict.decode_cell(
            shape,
            records,
            facts,
            rules,
            idle=idle,
            percentiles=(cell.get("latency") or {}).get("percentiles"),
            slo_targets=(cell.get("slo") or {}).get("slo"),
            client_roofline=roofline,
        )
    elif cell["phase"] == "interference":
        new = interference_cell(shape, records, idle=idle)
    elif cell["phase"] == "session":
        new = session_cell(shape, records, idle=idle, rules=rules)
    else:
        new = verdict.prefill_cell(shape, records, idle=idle, measured_in=cell.get("measured_in"))
    method = (cell.get("prompt_tokens") or {}).get("method")
    check = new.get("prompt_tokens")
    if method is not None and isinstance(check, dict):
        check["method"] = method
    for key in ("records", "not_run"):
        if key in cell:
            new[key] = cell[key]
    return new


def slo_judged_doc(
    doc: dict, records_of: Callable[[dict], Records | None], targets: dict[str, float]
) -> dict:
    """``doc`` with every decode cell's ``slo`` (attainment, goodput) judged against
    ``targets`` (ms) from its records: ``doc`` itself when its cells were judged against
    them, else a copy whose decode cells are judged again (`speedmatrix.slo.evaluate`); a
    cell without records (``records_of`` gives None) or without a window keeps no ``slo``.
    What a report asked for another SLO shows."""
    cells = doc.get("cells") or []
    if all(
        (c.get("slo") or {}).get("slo") == targets
        for c in cells
        if c.get("phase") == "decode" and c.get("records")
    ):
        return doc
    out = copy.deepcopy(doc)
    for c in out.get("cells") or []:
        if c.get("phase") != "decode":
            continue
        c.pop("slo", None)
        rec = records_of(c) if c.get("records") else None
        if rec is None or c.get("t0_ns") is None or c.get("t1_ns") is None:
            continue
        c["slo"] = slo.evaluate(
            rec.requests,
            rec.events,
            int(c["t0_ns"]),
            int(c["t1_ns"]),
            targets,
            open_loop=c.get("rate_per_s") is not None,
        )
    return out
