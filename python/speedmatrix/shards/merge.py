"""The shards' end-of-cell records pooled into one cell's records (pure, numpy), as the
core pools its own loops (`merge_loop_records`, docs/SCALE.md): every time moved onto the
driver's clock, the requests ordered by (phase, send time, shard, id) and renumbered, the
token events merged by time with their request ids renumbered, slots and bodies given back
their global numbers. Every figure is then derived from the pooled records by the same one
derivation as an unsharded cell's; nothing is averaged across shards.

The pooled window: a duration-bound window is the span every shard's window covers (the
latest opening to the earliest end: there every shard runs its whole load); a
request-bound one (``max_requests``) spans them all. Counts are summed, extremes kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speedmatrix.records import Records
from speedmatrix.shards.clock import ClockOffset
from speedmatrix.shards.deal import Dealt

__all__ = [
    "REQUEST_TIMES",
    "ShardPart",
    "failed",
    "pool_records",
    "start_problem",
    "window_problem",
]

NEVER = -1  # kNever (clock.hpp)
#: the request columns that are CLOCK_MONOTONIC times
REQUEST_TIMES = (
    "scheduled_ns",
    "sent_ns",
    "first_byte_ns",
    "first_token_ns",
    "first_content_ns",
    "done_ns",
)
_STAMP_TIMES = ("ramp_start_ns", "window_start_ns", "window_end_ns", "warmup_start_ns", "end_ns")
_PHASE_WINDOW = 1


@dataclass
class ShardPart:
    """One shard's end-of-cell records, on its own clock, and how it was dealt and timed."""

    dealt: Dealt
    offset: ClockOffset
    requests: dict[str, Any]
    events: dict[str, Any]
    stamps: dict[str, Any]
    #: the common start time on the shard's clock, and when the shard did start (ns)
    start_at_ns: int = NEVER
    started_ns: int = NEVER
    node: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return f"shard {self.dealt.index}" + (f" (node {self.node})" if self.node else "")


def _shift(col: Any, offset_ns: int) -> np.ndarray:
    a = np.asarray(col, dtype=np.int64)
    return np.where(a == NEVER, a, a - offset_ns)


def _take(col: Any, order: np.ndarray) -> Any:
    """Rows ``order`` of a column; a list column (strings) stays a list."""
    if isinstance(col, list):
        return [col[i] for i in order]
    return np.asarray(col)[order]


def _concat(cols: list[Any]) -> Any:
    if cols and all(isinstance(c, list) for c in cols):
        return [x for c in cols for x in c]
    return np.concatenate([np.asarray(c) for c in cols])


def _part_requests(p: ShardPart) -> dict[str, Any]:
    """Shard p's requests on the driver's clock, slots and bodies numbered globally."""
    req = dict(p.requests)
    for name in REQUEST_TIMES:
        if name in req:
            req[name] = _shift(req[name], p.offset.offset_ns)
    i, k = p.dealt.index, p.dealt.of
    slot = np.asarray(req["slot"], dtype=np.int64)
    req["slot"] = np.where(slot >= 0, i + slot * k, slot).astype(
        np.asarray(p.requests["slot"]).dtype
    )
    body = np.asarray(req["body"], dtype=np.int64)
    glob = i + body * k
    window = np.asarray(req["phase"]) == _PHASE_WINDOW
    glob = np.where(window, glob % max(p.dealt.bodies, 1), glob)
    req["body"] = np.where(body >= 0, glob, body).astype(np.asarray(p.requests["body"]).dtype)
    return req


def _pool_requests(parts: list[ShardPart]) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The pooled request columns, and each part's old id -> new id."""
    reqs = [_part_requests(p) for p in parts]
    names = list(reqs[0]) if reqs else []
    sizes = [len(r["sent_ns"]) for r in reqs]
    phase = np.concatenate([np.asarray(r["phase"], dtype=np.int64) for r in reqs])
    sent = np.concatenate([np.asarray(r["sent_ns"], dtype=np.int64) for r in reqs])
    sent = np.where(sent == NEVER, np.iinfo(np.int64).max, sent)  # never sent: last
    shard = np.concatenate([np.full(n, s, np.int64) for s, n in enumerate(sizes)])
    rid = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes])
    order = np.lexsort((rid, shard, sent, phase))
    new_id = np.empty(len(order), np.int64)
    new_id[order] = np.arange(len(order))
    starts = np.cumsum([0, *sizes])
    maps = [new_id[starts[s] : starts[s + 1]] for s in range(len(sizes))]
    pooled = {n: _take(_concat([r[n] for r in reqs]), order) for n in names}
    return pooled, maps


def _pool_events(parts: list[ShardPart], maps: list[np.ndarray]) -> dict[str, Any]:
    """Token events merged by driver time (ties: the lower shard first), ids renumbered;
    the engine's own send stamps (``server_ns``) stay on the engine's clock."""
    cols: dict[str, list[np.ndarray]] = {}
    for p, m in zip(parts, maps):
        ev = dict(p.events)
        ev["t_ns"] = _shift(ev["t_ns"], p.offset.offset_ns)
        req = np.asarray(ev["request"], dtype=np.int64)
        ok = (req >= 0) & (req < len(m))
        ev["request"] = np.where(ok, m[np.clip(req, 0, max(len(m) - 1, 0))] if len(m) else req, req)
        ev["request"] = ev["request"].astype(np.asarray(p.events["request"]).dtype)
        for n, v in ev.items():
            cols.setdefault(n, []).append(np.asarray(v))
    out = {n: np.concatenate(v) for n, v in cols.items()}
    if "t_ns" in out:
        order = np.argsort(out["t_ns"], kind="stable")
        out = {n: v[order] for n, v in out.items()}
    return out


def _window(parts: list[ShardPart], request_bound: bool) -> tuple[int, int]:
    t0s = [p.offset.to_driver(int(p.stamps["window_start_ns"])) for p in parts]
    t1s = [p.offset.to_driver(int(p.stamps["window_end_ns"])) for p in parts]
    if any(int(p.stamps["window_start_ns"]) <= 0 for p in parts):
        return NEVER, NEVER  # a shard's window never opened
    if request_bound:
        return min(t0s), max(t1s)
    return max(t0s), min(t1s)


def _stamps(parts: list[ShardPart], request_bound: bool) -> dict[str, Any]:
    """The pooled cell's stamps: times on the driver's clock, counts summed."""
    st = [dict(p.stamps) for p in parts]
    for p, s in zip(parts, st):
        for n in _STAMP_TIMES:
            v = int(s.get(n, NEVER))
            s[n] = NEVER if v == NEVER else p.offset.to_driver(v)

    def first(name: str, default: Any) -> Any:
        return min((s[name] for s in st if s[name] != NEVER), default=default)

    t0, t1 = _window(parts, request_bound)
    ends = [str(s.get("stopped_by") or "") for s in st]
    stopped = next((r for r in ("stop", "unreachable") if r in ends), ends[0] if ends else "")
    return {
        "ramp_start_ns": first("ramp_start_ns", NEVER),
        "window_start_ns": t0,
        "window_end_ns": t1,
        "warmup_start_ns": first("warmup_start_ns", NEVER),
        "end_ns": max((s["end_ns"] for s in st), default=NEVER),
        "ramp_capped": any(bool(s.get("ramp_capped")) for s in st),
        "stopped_by": stopped,
        "stop_reason": next((str(s["stop_reason"]) for s in st if s.get("stop_reason")), ""),
        "stalls": sum(int(s.get("stalls", 0)) for s in st),
        "warmup_retried": sum(int(s.get("warmup_retried", 0)) for s in st),
        "backoffs": sum(int(s.get("backoffs", 0)) for s in st),
        "backoff_s": sum(float(s.get("backoff_s", 0.0)) for s in st),
        "client_cpu_s": sum(float(s.get("client_cpu_s", 0.0)) for s in st),
        "client_threads": max((int(s.get("client_threads", 1)) for s in st), default=1),
        "loop_lag_max_ms": max((float(s.get("loop_lag_max_ms", 0.0)) for s in st), default=0.0),
        "fatal_error": "; ".join(
            f"{p.label()}: {s['fatal_error']}" for p, s in zip(parts, st) if s.get("fatal_error")
        ),
        "events_note": "; ".join(str(s["events_note"]) for s in st if s.get("events_note")),
    }


def pool_records(
    parts: list[ShardPart], *, request_bound: bool = False, metrics: Any = None
) -> Records:
    """One cell's records from its shards' (``metrics``: the driver's /metrics samples)."""
    if not parts:
        raise ValueError("no shard records to pool")
    requests, maps = _pool_requests(parts)
    events = _pool_events(parts, maps)
    rec = Records(requests=requests, events=events, **_stamps(parts, request_bound))
    if metrics is not None:
        rec.metrics = metrics
    rec.shards = len(parts)
    return rec


def start_problem(parts: list[ShardPart], tolerance_ns: int) -> str | None:
    """The first shard that started its cell more than ``tolerance_ns`` after the common
    start time (or never started), said in one line; None when all were on time."""
    for p in parts:
        if p.started_ns == NEVER:
            return f"{p.label()} never started the cell"
        late = p.started_ns - p.start_at_ns
        if late > tolerance_ns:
            return (
                f"{p.label()} started {late / 1e6:.0f} ms after the common start time "
                f"(allowed {tolerance_ns / 1e6:.0f} ms): the load was not whole"
            )
    return None


def window_problem(parts: list[ShardPart], pooled: Records, least_share: float) -> str | None:
    """Shards whose windows overlap less than ``least_share`` of the shortest one: the span
    of the whole load is too short to stand for the cell. None when it is long enough."""
    spans = [
        int(p.stamps["window_end_ns"]) - int(p.stamps["window_start_ns"])
        for p in parts
        if int(p.stamps["window_start_ns"]) > 0
    ]
    if not spans or pooled.window_start_ns <= 0:
        return None
    both = pooled.window_end_ns - pooled.window_start_ns
    if both >= least_share * min(spans):
        return None
    opens = [p.offset.to_driver(int(p.stamps["window_start_ns"])) for p in parts]
    late = int(np.argmax(opens))
    return (
        f"the shards' windows overlap {max(both, 0) / 1e9:.2f} s of {min(spans) / 1e9:.2f} s: "
        f"{parts[late].label()} opened its window {(opens[late] - min(opens)) / 1e9:.2f} s "
        "after the first"
    )


def failed(rec: Records, reason: str) -> Records:
    """The pooled records of a cell that is an error: no window, ``reason`` its why (the
    raw records are kept)."""
    rec.window_start_ns = rec.window_end_ns = NEVER
    rec.fatal_error = reason
    return rec
