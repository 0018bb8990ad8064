"""`speedmatrix selftest`: the client's roofline on this host (docs/SCALE.md).

For 1..N event loops the C++ core runs three short cells against the built-in engine on
this machine and this measures what the client can take in:

- ``requests_per_s``: one-token requests, unpaced (the engine answers as fast as it
  can): requests completed per second of the window;
- ``events_per_s``: long streams, unpaced: SSE token events received per second;
- ``lockstep_p99_delay_ms``: ``lockstep_streams`` streams moving in lockstep (one 20 ms
  decode step for all, the engine's ``lockstep`` profile): the 99th percentile of the
  delay from the engine's send stamp to the client's read (both CLOCK_MONOTONIC).

The engine shares the machine's cores with the client, so the figures are a floor of
what the client alone could do (said beside them). The result is cached per host
(speedmatrix.roofline) and copied into run.json (``meta["client_roofline"]``) when a run starts;
the verdict's `client_near_limit` flag and the cell's ``client_headroom`` read it
(`speedmatrix.verdict.client`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from speedmatrix import __version__
from speedmatrix._native import _core
from speedmatrix.roofline import default_loops
from speedmatrix.runmeta import utc_now
from speedmatrix.sim import Sim

__all__ = ["measure"]

#: streams per loop of the unpaced cells (enough to keep a loop busy, few enough to start fast)
UNPACED_STREAMS_PER_LOOP = 16


def _body(max_tokens: int) -> bytes:
    return json.dumps(
        {"prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    ).encode()


def _cell(url: str, body: bytes, streams: int, loops: int, duration_s: float) -> Any:
    spec = _core.CellSpec()
    spec.url = url
    spec.bodies = [body]
    spec.concurrency = streams
    spec.duration_s = duration_s
    spec.server_stamps = True
    spec.idle_timeout_s = 30
    spec.client_threads = loops
    # one-token warm-up requests open the connections the window reuses
    spec.warmup_bodies = [_body(1)] * streams
    spec.warmup_timeout_s = 60
    res = _core.CellRunner(spec).run()
    if res.fatal_error:
        raise RuntimeError(res.fatal_error)
    return res


def _window(res: Any) -> tuple[float, np.ndarray, np.ndarray]:
    """(window s, the window's event mask, its request mask)."""
    t0, t1 = int(res.window_start_ns), int(res.window_end_ns)
    ev_t = np.asarray(res.events["t_ns"])
    done = np.asarray(res.requests["done_ns"])
    ok = np.asarray(res.requests["outcome"]) == 1
    window_s = max((t1 - t0) / 1e9, 1e-9)
    return window_s, (ev_t >= t0) & (ev_t <= t1), ok & (done >= t0) & (done <= t1)


def _unpaced(url: str, loops: int, duration_s: float) -> dict:
    streams = UNPACED_STREAMS_PER_LOOP * loops
    res = _cell(url, _body(1), streams, loops, duration_s)
    window_s, _, done = _window(res)
    requests_per_s = float(np.count_nonzero(done)) / window_s
    res = _cell(url, _body(100_000), streams, loops, duration_s)
    window_s, inside, _ = _window(res)
    tokens = np.asarray(res.events["tokens"])[inside]
    return {
        "requests_per_s": round(requests_per_s, 1),
        "events_per_s": round(float(np.count_nonzero(inside)) / window_s, 1),
        "tokens_per_s": round(float(tokens.sum()) / window_s, 1),
        "client_cpu_s": round(float(res.client_cpu_s), 3),
    }


def _lockstep(url: str, loops: int, streams: int, duration_s: float) -> dict:
    res = _cell(url, _body(4000), streams, loops, duration_s)
    window_s, inside, _ = _window(res)
    t = np.asarray(res.events["t_ns"])[inside]
    sent = np.asarray(res.events["server_ns"])[inside]
    stamped = sent > 0
    delay_ms = (t[stamped] - sent[stamped]) / 1e6
    p99 = float(np.percentile(delay_ms, 99)) if len(delay_ms) else float("nan")
    return {
        "lockstep_streams": streams,
        "lockstep_events_per_s": round(float(np.count_nonzero(inside)) / window_s, 1),
        "lockstep_p99_delay_ms": round(p99, 3),
    }


def measure(
    loops: Sequence[int] | None = None,
    duration_s: float = 2.0,
    lockstep_streams: int = 512,
    say: Callable[[str], None] | None = None,
) -> dict:
    """The roofline for each loop count in ``loops`` (`default_loops` when None)."""
    loops = list(loops or default_loops())
    rows: list[dict] = [{"client_threads": n} for n in loops]
    load_before = os.getloadavg()[0]
    with Sim("fixed", stamp=True, unpaced=True) as sim:
        url = sim.url + "/v1/completions"
        for row in rows:
            if say:
                say(f"selftest: {row['client_threads']} loop(s), unpaced")
            row.update(_unpaced(url, row["client_threads"], duration_s))
    with Sim("lockstep", stamp=True) as sim:
        url = sim.url + "/v1/completions"
        for row in rows:
            if say:
                say(f"selftest: {row['client_threads']} loop(s), {lockstep_streams} in lockstep")
            row.update(_lockstep(url, row["client_threads"], lockstep_streams, duration_s))
            time.sleep(0.5)  # the engine aborts the cancelled streams before the next cell
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "tool_version": __version__,
        "measured_at": utc_now(),
        "duration_s": duration_s,
        "load_average": round(load_before, 2),
        "engine": "the built-in engine on the same cores (the figures are a floor)",
        "loops": rows,
    }
