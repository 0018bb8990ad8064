"""What the server's own gauges said over a cell's window (its /metrics samples): running,
waiting, the waiting it held once the first wave was admitted, KV usage.
"""

from __future__ import annotations

import numpy as np

from speedmatrix.verdict.rules import EngineFacts

__all__ = ["held_waiting", "server_view"]


def server_view(metrics: dict, facts: EngineFacts, t0: int, t1: int, settle: int) -> dict | None:
    """What the server's own gauges said over the window [t0, t1]: mean and peak running,
    peak waiting, the waiting it held once the first wave settled, peak KV usage."""
    names = list(metrics.get("names", []))
    if not names or len(metrics["t_ns"]) == 0:
        return None
    t = np.asarray(metrics["t_ns"])
    vals = np.asarray(metrics["values"], dtype=float).reshape(len(t), len(names))
    inside = (t >= t0) & (t <= t1)
    if not inside.any():
        return None
    out: dict = {"samples": int(inside.sum()), "poll_failures": int(metrics.get("failures", 0))}

    def col(name):
        if name and name in names:
            v = vals[inside, names.index(name)]
            v = v[np.isfinite(v)]
            return v if len(v) else None
        return None

    m_run, m_wait, m_kv = facts.metric_running, facts.metric_waiting, facts.metric_kv_usage
    running, waiting, kv = col(m_run), col(m_wait), col(m_kv)
    out["running_mean"] = float(running.mean()) if running is not None else None
    out["running_max"] = float(running.max()) if running is not None else None
    out["waiting_max"] = float(waiting.max()) if waiting is not None else None
    out["waiting_mean_settled"] = None
    out["waiting_held_mean"] = None
    if m_wait and m_wait in names:
        w_all = vals[:, names.index(m_wait)]
        r_all = vals[:, names.index(m_run)] if m_run in names else None
        # A burst of N arrivals queues briefly on any server while the first
        # wave is admitted; a server that cannot run N at once keeps some
        # waiting after that. Judge from the samples after the first wave
        # settled (or the window's second half if it never did).
        after = (t >= max(settle, t0)) & (t <= t1)
        if after.sum() < 2 or settle >= t1:
            after = (t >= t0 + (t1 - t0) // 2) & (t <= t1)
        w = w_all[after]
        out["waiting_mean_settled"] = float(np.nanmean(w)) if np.isfinite(w).any() else None
        out["waiting_held_mean"] = held_waiting(w_all, r_all, inside, after)
    out["kv_usage_max"] = float(kv.max()) if kv is not None else None
    if all(out[k] is None for k in ("running_mean", "waiting_max", "kv_usage_max")):
        return None
    return out


def held_waiting(
    waiting: np.ndarray, running: np.ndarray | None, inside: np.ndarray, judged: np.ndarray
) -> float | None:
    """Mean over the `judged` samples of the requests the server kept waiting.

    A sample's waiting requests count as held when the server was not admitting:
    its running count was no higher than at an earlier sample of the window (a
    server still taking in the first wave reaches a new high at every sample,
    and the request it is about to admit shows as waiting for a moment). A held
    sample counts only next to another held one: a server that cannot run N at
    once keeps requests waiting from sample to sample, while a request handed to
    the scheduler between two steps is seen once at most."""
    idx = np.flatnonzero(inside)
    if len(idx) == 0 or not judged.any():
        return None
    w = np.nan_to_num(waiting[idx], nan=0.0)
    held = w > 0
    if running is not None:
        r = running[idx]
        prior_max = np.maximum.accumulate(np.where(np.isfinite(r), r, -np.inf))
        prior_max = np.concatenate(([-np.inf], prior_max[:-1]))
        held &= ~(np.isfinite(r) & (r > prior_max))
    pair = np.zeros_like(held)
    pair[1:] |= held[1:] & held[:-1]
    pair[:-1] |= held[:-1] & held[1:]
    sel = judged[idx]
    return float(np.mean(np.where(pair, w, 0.0)[sel])) if sel.any() else None
