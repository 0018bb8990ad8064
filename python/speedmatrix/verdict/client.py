"""The client's headroom in a cell and the `client_near_limit` rule, pure.

The roofline is `speedmatrix selftest`'s (run.json ``meta["client_roofline"]``): for each
loop count, the requests/s and SSE events/s the client took in on this host. A cell's
demand is what it made the client take in: window token events and finished requests
per second of its window. Its headroom is the roofline over the demand, the smaller of
the two ratios; below `Rules.client_near_limit_headroom` (2: the cell needed more than
half of the roofline) the cell is flagged `client_near_limit`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from speedmatrix.records import Records

__all__ = ["cell_headroom", "client_headroom", "limit_for", "near_limit"]


def limit_for(roofline: dict[str, Any] | None, threads: int) -> tuple[float, float] | None:
    """(events/s, requests/s) the client takes in with ``threads`` loops: the roofline's row
    with the most loops not above ``threads`` (its fewest when every row has more);
    None without a roofline."""
    rows = [
        r
        for r in (roofline or {}).get("loops") or []
        if isinstance(r, dict) and r.get("events_per_s") and r.get("requests_per_s")
    ]
    if not rows:
        return None
    below = [r for r in rows if int(r.get("client_threads", 1)) <= max(threads, 1)]
    row = (
        max(below, key=lambda r: int(r["client_threads"]))
        if below
        else min(rows, key=lambda r: int(r.get("client_threads", 1)))
    )
    return float(row["events_per_s"]), float(row["requests_per_s"])


def client_headroom(
    events_per_s: float, requests_per_s: float, limit: tuple[float, float] | None
) -> float | None:
    """The roofline over the cell's demand (the smaller ratio); None without a roofline
    or a demand."""
    if limit is None:
        return None
    ratios = [
        lim / got
        for got, lim in ((events_per_s, limit[0]), (requests_per_s, limit[1]))
        if got > 0 and math.isfinite(got) and lim > 0
    ]
    return min(ratios) if ratios else None


def cell_headroom(records: Records, t0: int, t1: int, roofline: dict | None) -> float | None:
    """A cell's headroom: the roofline for its loops over what its window [t0, t1] made the
    client take in (token events and finished requests per second; a sharded cell's, per
    shard: each client node is assumed as fast as the host that ran the selftest), to 2
    decimals."""
    limit = limit_for(roofline, int(records.client_threads))
    if limit is None or t1 <= t0:
        return None
    window_s = (t1 - t0) / 1e9
    ev_t = np.asarray(records.events.get("t_ns", np.zeros(0, np.int64)))
    done = np.asarray(records.requests["done_ns"])
    events = int(np.count_nonzero((ev_t >= t0) & (ev_t <= t1)))
    finished = int(np.count_nonzero((done >= t0) & (done <= t1)))
    # a sharded cell's demand is spread over its shards, each on a host like this one
    per_shard_s = window_s * max(int(records.shards), 1)
    h = client_headroom(events / per_shard_s, finished / per_shard_s, limit)
    return None if h is None else round(h, 2)


def near_limit(headroom: float | None, least_headroom: float) -> bool:
    """`client_near_limit`: the cell needed more than 1 / least_headroom of the roofline."""
    return headroom is not None and headroom < least_headroom
