"""Client core vs a Python client, side by side against the same local engine.

    PYTHONPATH=python python3 bench/client_bench.py [--duration 5] [--streams 16,128,512,1024]

Both clients run a closed loop of N streams against `speedmatrix-sim --profile
fixed --stamp` (TTFT 50 ms, ITL 20 ms, every chunk stamped with its send time
on CLOCK_MONOTONIC), then against `--unpaced` (tokens as fast as the sockets
take them). For each it prints:
  CPU per token   process CPU time of the client over the run / tokens received
  delay p50/p99   client arrival time - server send stamp, per token event
  tok/s           tokens that arrived inside the window / window length
and the ratios (python / core for CPU and delay, core / python for tok/s).
The engine runs in its own process on the same cores: on a 2-core machine the
clients compete with it, as they would with a real server's CPU threads.
A benchmark prints figures; it does not fail on a slow machine.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # BLAS threads would add to the client CPU
import resource
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))

import py_client
from speedmatrix._native import _core
from speedmatrix.sim import Sim


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def wait_idle(sim: Sim, timeout_s: float = 30.0) -> None:
    """The engine aborts cancelled streams; wait until it has none left."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with urllib.request.urlopen(sim.url + "/sim/state", timeout=5) as r:
            st = json.loads(r.read())
        if not st.get("running") and not st.get("waiting"):
            return
        time.sleep(0.1)


def figures(t_ns, server_ns, tokens, t0, t1, cpu_s) -> dict:
    t_ns = np.asarray(t_ns, dtype=np.int64)
    server_ns = np.asarray(server_ns, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    inside = (t_ns >= t0) & (t_ns <= t1)
    stamped = inside & (server_ns > 0)
    delay_ms = (t_ns[stamped] - server_ns[stamped]) / 1e6
    total = int(tokens.sum())
    return {
        "cpu_us_per_token": cpu_s / total * 1e6 if total else float("nan"),
        "delay_p50_ms": float(np.percentile(delay_ms, 50)) if len(delay_ms) else float("nan"),
        "delay_p99_ms": float(np.percentile(delay_ms, 99)) if len(delay_ms) else float("nan"),
        "tok_s": float(tokens[inside].sum()) / ((t1 - t0) / 1e9),
        "tokens": total,
        "cpu_s": cpu_s,
    }


def run_core(url: str, body: bytes, n: int, duration_s: float) -> dict:
    spec = _core.CellSpec()
    spec.url = url
    spec.bodies = [body]
    spec.concurrency = n
    spec.duration_s = duration_s
    spec.server_stamps = True
    spec.idle_timeout_s = 30
    runner = _core.CellRunner(spec)
    cpu0 = time.process_time()
    res = runner.run()
    cpu = time.process_time() - cpu0
    if res.fatal_error:
        raise RuntimeError(res.fatal_error)
    ev = res.events
    f = figures(
        ev["t_ns"], ev["server_ns"], ev["tokens"], res.window_start_ns, res.window_end_ns, cpu
    )
    f["errors"] = int(np.sum(res.requests["outcome"] == 3))
    f["loop_lag_max_ms"] = res.loop_lag_max_ms
    return f


def run_python(url: str, body: bytes, n: int, duration_s: float) -> dict:
    cpu0 = time.process_time()
    r = py_client.run(url, body, n, duration_s)
    cpu = time.process_time() - cpu0
    f = figures(r.t_ns, r.server_ns, r.tokens, r.t0_ns, r.t1_ns, cpu)
    f["errors"] = r.errors
    return f


def row(label: str, f: dict) -> str:
    return (
        f"  {label:<7} CPU/token {f['cpu_us_per_token']:7.2f} us   delay p50 {f['delay_p50_ms']:8.3f} ms"
        f"  p99 {f['delay_p99_ms']:8.3f} ms   {f['tok_s']:>11,.0f} tok/s   errors {f['errors']}"
    )


def compare(name: str, core: dict, py: dict | None) -> dict:
    print(f"{name}")
    print(row("core", core))
    out = {"scenario": name, "core": core}
    if py is not None:
        print(row("python", py))
        ratio = {
            "cpu_per_token_py_over_core": py["cpu_us_per_token"] / core["cpu_us_per_token"],
            "delay_p99_py_over_core": py["delay_p99_ms"] / core["delay_p99_ms"],
            "tok_s_core_over_py": core["tok_s"] / py["tok_s"],
        }
        print(
            f"  ratio   CPU/token python/core {ratio['cpu_per_token_py_over_core']:.1f}x   "
            f"delay p99 python/core {ratio['delay_p99_py_over_core']:.1f}x   "
            f"tok/s core/python {ratio['tok_s_core_over_py']:.2f}x"
        )
        out.update(python=py, ratio=ratio)
    sys.stdout.flush()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="window per run, s")
    ap.add_argument("--streams", default="16,128,512,1024", help="paced concurrency levels")
    ap.add_argument("--unpaced-streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=4000, help="per request (paced: 20 ms each)")
    ap.add_argument("--no-python", action="store_true", help="only the core")
    ap.add_argument(
        "--profile",
        default="lockstep",
        help="engine profile of the paced runs: lockstep (one 20 ms decode step for "
        "all streams, as a real engine and the reference figures) or fixed (each "
        "stream on its own 20 ms schedule)",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    raise_nofile()

    print(
        f"client_bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"window {args.duration:g} s per run"
    )
    results = []
    body = json.dumps(
        {
            "prompt": "hello",
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    ).encode()
    with Sim(args.profile, stamp=True) as sim:
        url = sim.url + "/v1/completions"
        for n in [int(x) for x in args.streams.split(",") if x]:
            wait_idle(sim)
            core = run_core(url, body, n, args.duration)
            py = None
            if not args.no_python:
                wait_idle(sim)
                py = run_python(url, body, n, args.duration)
            results.append(compare(f"{n} streams, ITL 20 ms", core, py))

    unpaced_body = json.dumps(
        {
            "prompt": "hello",
            "max_tokens": 100_000,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    ).encode()
    with Sim("fixed", stamp=True, unpaced=True) as sim:
        url = sim.url + "/v1/completions"
        n = args.unpaced_streams
        wait_idle(sim)
        core = run_core(url, unpaced_body, n, args.duration)
        py = None
        if not args.no_python:
            wait_idle(sim)
            py = run_python(url, unpaced_body, n, args.duration)
        results.append(compare(f"unpaced, {n} streams", core, py))

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
