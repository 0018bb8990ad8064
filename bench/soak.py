"""Soak benchmark of the client core: many streams for a long window against the built-in
engine, watching the client's memory and descriptors and accounting for every token.

    PYTHONPATH=python python3 bench/soak.py [--streams 1024] [--duration 600] [--max-tokens 2000]

One cell (closed loop: each stream sends its next request when one ends, so connections
and requests turn over all the time) runs on a worker thread while this thread samples, once
a second, the process's RSS (/proc/self/status) and open descriptors (/proc/self/fd). It
prints:
  RSS after the first minute (or the first sixth of a shorter run) and at the end, and the
  growth between them (target: under 5 %; the window's token records are part of it, at
  ~10 bytes an event, docs/RELIABILITY.md);
  descriptors before, at the peak, and after the cell (target: back to the start: no leak);
  tokens counted by the client vs tokens the engine says it sent (GET /sim/state): the
  difference is tokens written to sockets the client had already closed at the window's end,
  at most one event's worth per stream.
A benchmark prints figures; it does not fail on a slow machine. docs/RELIABILITY.md holds
the latest figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

import numpy as np
from speedmatrix._native import _core
from speedmatrix.sim import Sim


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=600, help="window, s")
    ap.add_argument("--max-tokens", type=int, default=2000, help="per request (20 ms each)")
    ap.add_argument("--profile", default="fixed")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    body = json.dumps(
        {"prompt": "hello", "max_tokens": a.max_tokens, "ignore_eos": True, "stream": True}
    ).encode()
    samples: list[tuple[float, float, int]] = []
    with Sim(a.profile) as sim:
        sent0 = sim.state()["tokens_sent"]
        fd0 = fds()
        spec = _core.CellSpec()
        spec.url = sim.url + "/v1/completions"
        spec.bodies = [body]
        spec.concurrency = a.streams
        spec.duration_s = a.duration
        spec.idle_timeout_s = 60
        runner = _core.CellRunner(spec)
        box: dict = {}
        worker = threading.Thread(target=lambda: box.update(res=runner.run()), daemon=True)
        t0 = time.monotonic()
        worker.start()
        while worker.is_alive():
            samples.append((time.monotonic() - t0, rss_mb(), fds()))
            worker.join(1.0)
        res = box["res"]
        if sim.wait_idle(60) is False:
            print("soak: the engine did not go idle within 60 s", file=sys.stderr)
        sent = sim.state()["tokens_sent"] - sent0
    fd_after = fds()
    counted = int(np.asarray(res.events["tokens"], dtype=np.int64).sum())
    errors = int(np.sum(res.requests["outcome"] == 3))
    settle_s = min(60.0, a.duration / 6)
    after_first = [s for s in samples if s[0] >= settle_s] or samples
    rss_start, rss_end = after_first[0][1], samples[-1][1]
    growth = (rss_end - rss_start) / rss_start * 100
    figures = {
        "streams": a.streams,
        "window_s": a.duration,
        "requests": len(res.requests["outcome"]),
        "errors": errors,
        "events": len(res.events["t_ns"]),
        "rss_mb_after_settle": round(rss_start, 1),
        "rss_mb_end": round(rss_end, 1),
        "rss_growth_pct": round(growth, 2),
        "settle_s": settle_s,
        "fds_before": fd0,
        "fds_peak": max(s[2] for s in samples),
        "fds_after": fd_after,
        "tokens_counted": counted,
        "tokens_sent_by_engine": sent,
        "tokens_unaccounted": sent - counted,
        "tokens_unaccounted_per_stream": round((sent - counted) / a.streams, 2),
    }
    print(f"soak: {a.streams} streams, {a.duration:g} s window, load {os.getloadavg()[0]:.2f}")
    for k, v in figures.items():
        print(f"  {k:32s} {v}")
    print(
        f"  verdicts: RSS growth {'<' if growth < 5 else '>='} 5 %, descriptors "
        f"{'back to start' if fd_after <= fd0 else 'LEAKED'}, tokens "
        f"{'accounted' if 0 <= sent - counted <= a.streams * 4 else 'NOT accounted'}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
