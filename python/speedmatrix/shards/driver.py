"""One cell on the shards: the driver's side (docs/SCALE.md, "Many machines").

Before the cell: each shard's clock offset (`ShardPool.offset`, the fastest of several
pings) and a common start time a lead ahead, sent to each shard on its own clock. During
it: the server's /metrics sampled once, here. After it: the shards' end-of-cell records
pooled (`speedmatrix.shards.merge`). A shard that starts late, fails, or whose node dies
ends the others and makes the cell an error with that reason: never a smaller load.
"""

from __future__ import annotations

import time
from contextlib import suppress
from typing import Any

import numpy as np

from speedmatrix._native import _core
from speedmatrix.errors import SpeedmatrixError, clip
from speedmatrix.records import Records
from speedmatrix.shards.deal import deal, spec_fields
from speedmatrix.shards.merge import (
    REQUEST_TIMES,
    ShardPart,
    failed,
    pool_records,
    start_problem,
    window_problem,
)
from speedmatrix.shards.metrics import MetricsSampler
from speedmatrix.trafficrun import is_traffic_cell

__all__ = [
    "LATE_NS",
    "LIVE_EVERY_S",
    "START_LEAD_NS",
    "WINDOW_LEAST_SHARE",
    "LiveShards",
    "measure",
    "refuse_unsharded",
    "sweep_cell",
]

#: the common start is this far ahead of the driver's clock (at least; 20 round trips)
START_LEAD_NS = 500_000_000
#: a shard that starts more than this after the common start makes the cell an error
LATE_NS = 100_000_000
#: the shards' windows must overlap at least this share of the shortest one
WINDOW_LEAST_SHARE = 0.5

_STRINGS = ("finish_reason", "error_kind", "error_message")


def _no_records() -> Records:
    """A cell's records when no shard brought any back (every column empty)."""
    cols = ("slot", "body", "phase", "http_status", "outcome", "token_source", "retries")
    req: dict[str, Any] = {c: np.zeros(0, np.int64) for c in cols}
    req.update({c: np.zeros(0, np.int64) for c in ("prompt_tokens", "output_tokens")})
    req.update({c: np.zeros(0, np.int64) for c in ("reasoning_tokens", "cached_tokens")})
    req.update({"reasoning_deltas": np.zeros(0, np.int64)})
    req.update({c: np.zeros(0, np.int64) for c in REQUEST_TIMES})
    req.update({c: [] for c in _STRINGS})
    ev = {c: np.zeros(0, np.int64) for c in ("request", "t_ns", "tokens", "server_ns")}
    return Records(requests=req, events=ev)


#: the live view asks the shards for their counters at most this often
LIVE_EVERY_S = 0.5
_SUMMED = ("tokens", "completed", "errors", "in_flight", "first_tokens")
_SUMMED_WARMUP = ("warmup_total", "warmup_done")


class LiveShards:
    """The live view's runner (`progress.Progress`) for a sharded cell: the shards'
    counters summed, their window's start on the driver's clock (once every shard's is
    open), the driver's latest /metrics sample. Asks the shards at most every
    LIVE_EVERY_S; a shard that does not answer within a second leaves the last figures."""

    def __init__(self, ray: Any, actors: list[Any], offsets: list[Any], sampler: Any = None):
        self._ray, self._actors, self._offsets, self._sampler = ray, actors, offsets, sampler
        self._last: dict[str, Any] = {}
        self._at = 0.0

    def progress(self) -> dict[str, Any]:
        now = time.monotonic()
        if now - self._at < LIVE_EVERY_S:
            return self._last
        self._at = now
        try:
            got = self._ray.get([a.progress.remote() for a in self._actors], timeout=1.0)
        except Exception:  # noqa: BLE001 - a slow or lost shard: the cell's end says why
            return self._last
        out: dict[str, Any] = {k: sum(int(g.get(k, 0)) for g in got) for k in _SUMMED}
        out.update({k: sum(int(g.get(k, 0)) for g in got) for k in _SUMMED_WARMUP})
        opens = [int(g.get("window_start_ns", -1)) for g in got]
        out["window_start_ns"] = (
            max(o.to_driver(t) for o, t in zip(self._offsets, opens)) if min(opens) > 0 else -1
        )
        out["metrics"] = self._sampler.latest() if self._sampler is not None else {}
        self._last = out
        return out


def start_lead_ns(offsets: list[Any]) -> int:
    """How far ahead of now the common start is: START_LEAD_NS, or 20 of the slowest
    shard's fastest round trips when longer (the start must reach every shard first)."""
    return max(START_LEAD_NS, 20 * max(o.rtt_ns for o in offsets))


def cell_bound_s(fields: dict[str, Any]) -> float:
    """The longest a shard's part may take: its warm-up tries, the ramp's cap, the window,
    the open loop's drain, and a minute for the records' trip."""
    warm = float(fields["warmup_timeout_s"]) * (int(fields["warmup_retries"]) + 1)
    cell = float(fields["ramp_cap_s"]) + float(fields["duration_s"])
    return warm + cell + float(fields["drain_timeout_s"]) + 60.0


#: after a stop, how long the shards may take to send their records back
STOP_GRACE_S = 30.0


def _gather(
    ray: Any, refs: list[Any], actors: list[Any], bound_s: float
) -> tuple[dict[int, dict], str, bool]:
    """Each shard's answer by index, the first failure's reason, and whether Ctrl-C came.
    A failure, a late shard or a part past ``bound_s`` stops the others (their records
    still come back, for STOP_GRACE_S)."""
    got: dict[int, dict] = {}
    reason, interrupted = "", False
    pending, stopped = list(refs), False
    end = time.monotonic() + bound_s
    while pending:
        try:
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.2)
        except KeyboardInterrupt:
            interrupted, ready = True, []
        for ref in ready:
            i = refs.index(ref)
            try:
                got[i] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - an actor, its worker or its node died
                reason = reason or f"shard {i} failed mid-cell: {clip(exc, 200)}"
                continue
            if not got[i].get("ran") and not reason:
                reason = f"shard {i} did not start"
        late = pending and time.monotonic() > end
        if late and not reason and not interrupted:
            reason = f"shard {refs.index(pending[0])} did not end the cell in {bound_s:.0f} s"
        if (interrupted or reason) and not stopped:
            stopped, end = True, time.monotonic() + STOP_GRACE_S  # stop all, then a grace
            for a in actors:
                with suppress(Exception):  # a dead actor cannot be stopped
                    a.stop.remote()
        elif late and stopped:
            break  # past the grace: what did not come back is lost, the cell says why
    return got, reason, interrupted


def measure(
    shard_pool: Any, spec: Any, api_key: str | None, sampler: Any = None, live: Any = None
) -> tuple:
    """Runs ``spec`` dealt over the pool's shards; returns (pooled Records, interrupted).
    ``sampler``: a `MetricsSampler` for the server; ``live(runner)``: given a `LiveShards`
    while the cell runs, None after."""
    ray = shard_pool._ray
    fields = spec_fields(spec)
    dealt = deal(fields, shard_pool.size)
    actors = shard_pool.actors[: len(dealt)]
    offsets = []
    for i in range(len(dealt)):
        try:
            offsets.append(shard_pool.offset(i))
        except Exception as exc:  # noqa: BLE001 - a lost shard or node: the cell says which
            rec = failed(_no_records(), f"shard {i}'s clock could not be read: {clip(exc, 200)}")
            rec.shards = len(dealt)
            return rec, False
    start_ns = int(_core.now_ns()) + start_lead_ns(offsets)
    if sampler is not None:
        sampler.start()
    try:
        refs = [
            a.run.remote(part, api_key, off.to_shard(start_ns), LATE_NS)
            for a, (_d, part), off in zip(actors, dealt, offsets)
        ]
        if live is not None:
            live(LiveShards(ray, actors, offsets, sampler))
        got, reason, interrupted = _gather(ray, refs, actors, cell_bound_s(fields))
    finally:
        if live is not None:
            live(None)
        if sampler is not None:
            sampler.finish()
    parts = [
        ShardPart(
            dealt=d,
            offset=offsets[i],
            requests=got[i]["requests"],
            events=got[i]["events"],
            stamps=got[i]["stamps"],
            start_at_ns=offsets[i].to_shard(start_ns),
            started_ns=int(got[i]["started_ns"]),
            node=shard_pool.nodes[i].get("host", ""),
        )
        for i, (d, _p) in enumerate(dealt)
        if i in got and got[i].get("ran")
    ]
    metrics = sampler.samples() if sampler is not None else None
    request_bound = int(fields.get("max_requests", 0)) > 0
    rec = (
        pool_records(parts, request_bound=request_bound, metrics=metrics)
        if parts
        else _no_records()
    )
    rec.shards = len(dealt)
    starts = [
        ShardPart(d, offsets[i], {}, {}, {}, offsets[i].to_shard(start_ns), got[i]["started_ns"])
        for i, (d, _p) in enumerate(dealt)
        if i in got
    ]
    why = reason if not interrupted else ""
    why = start_problem(starts, LATE_NS) or why
    if not why and parts and not request_bound:
        why = window_problem(parts, rec, WINDOW_LEAST_SHARE) or ""
    if why and not interrupted:
        failed(rec, why)
    return rec, interrupted


def sweep_cell(sweep: Any, spec: Any) -> Records | None:
    """A sweep's cell on its shards (`Sweep.shards`): the pooled records, or None when
    interrupted (the sweep is then marked interrupted). The server's /metrics, when the
    spec samples them, are sampled here once."""
    sampler = None
    if spec.metrics_url:
        client = sweep.target.client(4 * max(float(spec.metrics_interval_s), 0.25) + 1)
        sampler = MetricsSampler(
            client.get_text,
            spec.metrics_url,
            list(spec.metric_names),
            list(spec.metric_reduce),
            float(spec.metrics_interval_s),
        )
    key = sweep.target.client_config.api_key
    rec, interrupted = measure(
        sweep.shards, spec, key, sampler, live=lambda r: setattr(sweep.progress.live, "runner", r)
    )
    if interrupted:
        sweep.interrupted = True
        return None
    return rec


def refuse_unsharded(cells: list[Any], shards: int) -> None:
    """With --ray, a cell whose load is not dealt over the shards is refused in one line
    before anything runs, never run elsewhere in silence: a traffic cell (it runs in this
    process), or with more than one shard an open loop behind a --max-concurrency gate."""
    for c in cells:
        gated = c.rate_per_s is not None and int(c.concurrency) > 0
        if is_traffic_cell(c):
            raise SpeedmatrixError(
                f"--ray: cell {c.id} is a traffic cell, which runs in this process and not on "
                "the shards; run it without --ray"
            )
        if gated and shards > 1:
            raise SpeedmatrixError(
                f"--shards {shards}: cell {c.id} is an open loop behind --max-concurrency (one "
                "queue), which is not dealt over shards; use --shards 1 or no --ray"
            )
