"""Preemptions during a cell, and what they mean for its verdict. Pure: no I/O.

An engine that runs out of KV blocks mid-decode preempts requests (vLLM recomputes or
swaps them later): the cell's figures then include work done twice and requests that
stalled, so they are not a clean measurement of the load asked for. The count is the
increase of the engine's preemption counter (`MetricsSpec.preemptions`) over the cell's
metric samples.

Where the capacity rule could not decide the cell beforehand (max running unknown,
`PlannedCell.capacity_check` "measured"), the preemptions decide it: some = the requests
the server ran at once did not fit its KV cache = ``over_capacity``; none = a server that kept requests waiting while its free KV was
below what one prompt needs (vLLM admits a request only when its prompt's blocks are
free: requests that outgrow the pool before the next one is admitted make it wait,
not preempt) is out of KV too = ``over_capacity``; otherwise the cell keeps the status
its queue and errors gave it. Either way the cell says so (``capacity_decided_by``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from speedmatrix.verdict.names import Flag

__all__ = ["FLAG", "FLAG_SHORT", "FLAG_TEXT", "apply_preemptions", "preemptions_in"]

FLAG = Flag.PREEMPTED.value
FLAG_SHORT = Flag.PREEMPTED.short
FLAG_TEXT = Flag.PREEMPTED.text


def preemptions_in(metrics: dict, name: str | None) -> int | None:
    """Requests preempted over the cell's samples of the counter ``name``: the sum of its
    increases (a counter that went down was reset: its new value counts). None when the
    counter was not sampled."""
    names = list(metrics.get("names") or [])
    if not name or name not in names or len(metrics.get("t_ns", ())) == 0:
        return None
    t = np.asarray(metrics["t_ns"])
    values = np.asarray(metrics["values"], dtype=float).reshape(len(t), len(names))
    col = values[:, names.index(name)]
    col = col[np.isfinite(col)]
    if len(col) == 0:
        return None
    steps = np.diff(col)
    total = np.where(steps >= 0, steps, col[1:]).sum() if len(steps) else 0.0
    return round(float(total))


def waited_for_kv(metrics: dict, facts: Any, admit_share: float) -> bool | None:
    """Whether the server kept requests waiting while its KV cache had less free than
    ``admit_share`` (one prompt's share of the pool), in two samples in a row. None when
    the waiting count or the KV usage was not sampled, or no share is known."""
    names = list(metrics.get("names") or [])
    waiting = getattr(facts, "metric_waiting", None)
    usage = getattr(facts, "metric_kv_usage", None)
    if admit_share <= 0 or waiting not in names or usage not in names:
        return None
    t = np.asarray(metrics["t_ns"])
    if len(t) < 2:
        return None
    values = np.asarray(metrics["values"], dtype=float).reshape(len(t), len(names))
    w = np.nan_to_num(values[:, names.index(waiting)], nan=0.0)
    free = 1.0 - np.nan_to_num(values[:, names.index(usage)], nan=0.0)
    # a block's worth of slack: the gauge is a fraction of whole blocks
    short = (w > 0) & (free < admit_share - 1e-9)
    return bool(np.any(short[1:] & short[:-1]))


def apply_preemptions(
    cell: dict,
    preempted: int | None,
    capacity_check: str = "",
    kv_wait: bool | None = None,
    admit_share: float = 0.0,
) -> None:
    """Writes the count into ``cell["server"]["preemptions"]``, flags a cell with
    preemptions, and settles a cell whose capacity was left to the measurement
    (``kv_wait``: requests waited for free KV, `waited_for_kv`)."""
    if preempted is not None:
        if isinstance(cell.get("server"), dict):
            cell["server"]["preemptions"] = preempted
        else:
            cell["preemptions"] = preempted
        if preempted > 0:
            flags = cell.setdefault("flags", [])
            if FLAG not in flags:
                flags.append(FLAG)
    if capacity_check != "measured":
        return
    cell["capacity_check"] = "measured"
    cell["kv_admit_share"] = admit_share  # what `waited_for_kv` compared: recompute reads it
    if preempted is None:
        cell["capacity_decided_by"] = (
            "measurement, inconclusive: the preemption counter was not sampled"
        )
        return
    if not preempted and kv_wait and cell.get("status") in ("valid", "queued"):
        cell["status"] = "over_capacity"
        cell["reason"] = (
            "the server kept requests waiting while its free KV cache was smaller than one "
            "prompt: the requests it could run at once did not fit (max running unknown, "
            "so decided by measurement; a server whose max running is exactly the number "
            "it ran would only be queueing: give --max-running to decide)"
        )
        cell["capacity_decided_by"] = "measurement: requests waited for KV blocks"
        return
    if preempted > 0 and cell.get("status") in ("valid", "queued"):
        cell["status"] = "over_capacity"
        cell["reason"] = (
            f"the server preempted {preempted} request{'s' if preempted != 1 else ''}: the "
            "requests it ran at once did not fit its KV cache (max running unknown, so "
            "decided by measurement)"
        )
        cell["capacity_decided_by"] = f"measurement: {preempted} preemptions"
    elif preempted > 0:
        cell["capacity_decided_by"] = f"measurement: {preempted} preemptions (cell failed)"
    else:
        cell["capacity_decided_by"] = "measurement: no preemptions, the requests fit"


def capacity_check_of(shape: Any) -> str:
    """The shape's capacity check ("measured" or ""), from a PlannedCell or a CellShape."""
    return str(getattr(shape, "capacity_check", "") or "")
