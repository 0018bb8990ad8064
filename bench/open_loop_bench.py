"""The open loop's send lateness: how late the core hands each request to libcurl against its
schedule (sent_ns - scheduled_ns), at a fixed arrival rate against the built-in engine.
Prints figures; never a test. Figures go to docs/PERFORMANCE.md ("Open loop").

    python bench/open_loop_bench.py [RATE=512] [SECONDS=10] [ARRIVAL=poisson] [MAX_TOKENS=4]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from speedmatrix import _core, latency
from speedmatrix.sim import Sim
from speedmatrix.verdict import openloop


def main() -> None:
    rate = float(sys.argv[1]) if len(sys.argv) > 1 else 512.0
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    arrival = sys.argv[3] if len(sys.argv) > 3 else "poisson"
    max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    with Sim("test-fast") as sim:
        spec = _core.CellSpec()
        spec.url = sim.url + "/v1/completions"
        body = {
            "model": "sim-test",
            "prompt": "bench",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        spec.bodies = [json.dumps(body).encode()]
        spec.mode, spec.rate_per_s, spec.arrival, spec.seed = "open", rate, arrival, 1
        spec.duration_s, spec.drain_timeout_s = seconds, 30
        res = _core.CellRunner(spec).run()
    assert not res.fatal_error, res.fatal_error
    req = res.requests
    win = req["phase"] == 1
    late_ms = (req["sent_ns"][win] - req["scheduled_ns"][win]) / 1e6
    f = latency.open_loop_figures(
        req, res.window_start_ns, res.window_end_ns, rate, judge=openloop.kept_up
    )
    print(
        f"open loop, {arrival} {rate:g}/s for {seconds:g} s, {max_tokens} tokens each, "
        f"{os.cpu_count()} CPUs (engine on the same machine)"
    )
    print(
        f"  arrivals {f['arrivals']}, achieved {f['achieved_rate_per_s']:.1f}/s, "
        f"completed {f['completed']}, failed {f['failed']}, in flight max {f['in_flight_max']}"
    )
    print(f"  gap CV of the sends {f['interarrival_cv']:.3f}")
    print(
        "  send lateness (sent - scheduled) ms: "
        + ", ".join(f"p{p:g} {np.percentile(late_ms, p):.3f}" for p in (50, 90, 99, 99.9))
        + f", max {late_ms.max():.3f}"
    )
    print(f"  client CPU {res.client_cpu_s:.2f} s, loop lag max {res.loop_lag_max_ms:.2f} ms")


if __name__ == "__main__":
    main()
