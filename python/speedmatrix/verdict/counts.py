"""Small derivations the cells share: failed requests counted and quoted by kind, the
prompt-token check, and numbers made JSON-safe (NaN and inf as None)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from speedmatrix.records import Records
from speedmatrix.verdict.window import ERROR

__all__ = [
    "ERROR_EXAMPLE_CHARS",
    "error_counts",
    "error_examples",
    "finite",
    "interval",
    "prompt_check",
    "window_errors",
]

# An error message kept per error kind in a cell (`error_examples`) is cut to this
# many characters: enough to say why, never a request body.
ERROR_EXAMPLE_CHARS = 300


def finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def interval(ci: Any) -> list[float | None] | None:
    if not ci:
        return None
    lo, hi = finite(ci[0]), finite(ci[1])
    return None if lo is None or hi is None else [lo, hi]


def error_counts(req: dict, rows) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in rows:
        if req["outcome"][i] == ERROR:
            kind = req["error_kind"][i] or "unknown"
            out[kind] = out.get(kind, 0) + 1
    return out


def error_examples(req: dict, rows) -> dict[str, str]:
    """The first error message of each kind among `rows` (failed requests), cut to
    ERROR_EXAMPLE_CHARS: what the transport or the server said, never a request body."""
    out: dict[str, str] = {}
    messages = req.get("error_message")
    for i in rows:
        if req["outcome"][i] != ERROR:
            continue
        kind = req["error_kind"][i] or "unknown"
        if kind not in out:
            text = str(messages[i]) if messages is not None else ""
            out[kind] = text[:ERROR_EXAMPLE_CHARS]
    return out


def prompt_check(asked: int, reported: list[int]) -> dict:
    """The prompt-token check: what was asked and the range the server reported."""
    if not reported:
        return {"asked": int(asked), "reported_min": None, "reported_max": None, "exact": None}
    lo, hi = min(reported), max(reported)
    return {
        "asked": int(asked),
        "reported_min": lo,
        "reported_max": hi,
        "exact": bool(lo == asked and hi == asked),
    }


def window_errors(records: Records) -> dict[str, Any]:
    """A cell's failed requests of the measured window (phase 1) by kind, their total, an
    example of each kind, and the window's length: the fields a traffic cell (interference,
    sessions) stores beside its own figures."""
    req = records.requests
    rows = np.flatnonzero(req["phase"] == 1)
    errors = error_counts(req, rows)
    return {
        "errors": errors,
        "errors_total": sum(errors.values()),
        "error_examples": error_examples(req, rows),
        "measured_s": (int(records.window_end_ns) - int(records.window_start_ns)) / 1e9,
    }
