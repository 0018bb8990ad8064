"""A prefill-interference cell's stored form (`speedmatrix.interference` runs it): N streams
decode while one cold C-token prompt arrives every T seconds; how much do those prefills
stretch the decoders' time between tokens?

The cell is one open-loop schedule: its first N arrivals (bodies 0..N-1, at 0) are the
decoding streams, the others (bodies N.., at T, 2T, ...) the prefills. The figures are the
core's (`_core.interference_figures`, stats_interference.hpp) over the decoders' token
arrivals once every decoder streams (the settle point) until the window's end, against
each prefill's window from its send to its first token (its end, when it failed).

Status: ``valid`` when there are gaps both during and clear of a prefill; ``error``
otherwise, with the reason (no decoder streamed, no prefill reached the server's answer,
or the gaps fell all on one side).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from speedmatrix._native import _core
from speedmatrix.records import Records
from speedmatrix.verdict.cells import base_cell
from speedmatrix.verdict.counts import window_errors
from speedmatrix.verdict.flags import Evidence, flags_of
from speedmatrix.verdict.names import Status
from speedmatrix.verdict.rules import Rules

__all__ = ["LONG_GAP_MS", "interference_cell", "interference_figures"]

#: a gap longer than this is counted in ``gaps_over_100ms``
LONG_GAP_MS = 100.0


def _nan_none(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def interference_figures(records: Records, streams: int) -> dict[str, Any]:
    """The cell's figures from its records; ``streams``: N, the decoders' bodies 0..N-1."""
    req, ev = records.requests, records.events
    window = np.flatnonzero(req["phase"] == 1)
    decoders = window[req["body"][window] < streams]
    prefills = window[(req["body"][window] >= streams) & (req["sent_ns"][window] > 0)]
    firsts = req["first_token_ns"][decoders]
    t1 = int(records.window_end_ns)
    out: dict[str, Any] = {
        "interference_streams": int(np.count_nonzero(firsts > 0)),
        "interference_prefills": int(np.count_nonzero(req["first_token_ns"][prefills] > 0)),
    }
    if len(decoders) == 0 or (firsts <= 0).any():
        return out  # some decoder never streamed: no settle point
    settle = int(firsts.max())
    t = ev["t_ns"]
    keep = (ev["tokens"] > 0) & (t >= settle) & (t <= t1)
    arrivals = [np.sort(t[keep & (ev["request"] == i)]).tolist() for i in decoders]
    ends = np.where(
        req["first_token_ns"][prefills] > 0,
        req["first_token_ns"][prefills],
        req["done_ns"][prefills],
    )
    windows = [(int(s), int(e)) for s, e in zip(req["sent_ns"][prefills], ends)]
    f = _core.interference_figures(arrivals, windows, int(LONG_GAP_MS * 1e6))
    out.update(
        tbt_overlap_p99_ms=_nan_none(f["p99_tbt_overlap_ms"]),
        tbt_clear_p99_ms=_nan_none(f["p99_tbt_clear_ms"]),
        tbt_inflation=_nan_none(f["tbt_inflation"]),
        overlap_gaps=int(f["overlap_gaps"]),
        clear_gaps=int(f["clear_gaps"]),
        gaps_over_100ms=int(f["gaps_over_long"]),
    )
    return out


def interference_cell(shape: Any, records: Records, *, idle: bool) -> dict:
    """The stored cell: `base_cell`'s fields, the interference figures, status and flags."""
    base = base_cell(shape)
    base["interference_every_s"] = float(shape.interference_every_s)
    base.update(window_errors(records))
    base.update(interference_figures(records, int(shape.concurrency)))
    base["flags"] = flags_of(Evidence(idle=idle), Rules())
    reason = _why_not(base, int(shape.concurrency), records.fatal_error)
    base["status"] = Status.ERROR.value if reason else Status.VALID.value
    if reason:
        base["reason"] = reason
    return base


def _why_not(cell: dict, streams: int, fatal: str) -> str:
    """Why the cell has no figures ("" when it has them)."""
    if fatal:
        return fatal
    if cell["interference_streams"] < streams:
        return (
            f"{streams - cell['interference_streams']} of {streams} decoding streams never streamed"
        )
    if not cell["interference_prefills"]:
        return "no prefill reached its first token"
    if not cell.get("overlap_gaps") or not cell.get("clear_gaps"):
        side = "during" if not cell.get("overlap_gaps") else "clear of"
        return f"no decoder gap fell {side} a prefill: the inflation is undefined"
    return ""
