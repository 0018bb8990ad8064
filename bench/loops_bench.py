"""Many event loops (--client-threads) side by side: unpaced ingest and lockstep delay
with 1 and 2 (or more) loops, against the built-in engine on this machine.

    PYTHONPATH=python python3 bench/loops_bench.py [--loops 1,2] [--duration 4]
        [--unpaced-streams 32] [--lockstep-streams 512]

For each loop count it prints:
  unpaced events/s   token events received per second of the window (the engine
                     streams as fast as the sockets take them; the same total streams
                     for every loop count, dealt over the loops)
  client cores       the loops' CPU time / the cell's wall time
  engine cores       the engine process's CPU time over the same cell (/proc/PID/stat)
  events per client CPU s   what one core of client takes in: the engine's share is
                     left out (the engine and the client share this machine's cores)
  lockstep p99       client read - engine send stamp, 99th percentile, N streams moving
                     in one 20 ms decode step (the `lockstep` profile)
and the ratios against one loop. The engine runs on the same cores: on a 2-core machine
two loops and the engine compete, so raw events/s cannot double; the per-CPU-second
column says what the loops would take in with their own cores. A benchmark prints
figures; it does not fail on a slow machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from speedmatrix._native import _core
from speedmatrix.sim import Sim

TICK_S = os.sysconf("SC_CLK_TCK")


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S  # utime + stime


def body(max_tokens: int) -> bytes:
    return json.dumps(
        {"prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    ).encode()


def cell(sim: Sim, streams: int, loops: int, duration_s: float, max_tokens: int) -> dict:
    spec = _core.CellSpec()
    spec.url = sim.url + "/v1/completions"
    spec.bodies = [body(max_tokens)]
    spec.warmup_bodies = [body(1)] * streams
    spec.concurrency = streams
    spec.duration_s = duration_s
    spec.server_stamps = True
    spec.idle_timeout_s = 30
    spec.client_threads = loops
    pid = sim._proc.pid
    eng0, wall0 = proc_cpu_s(pid), time.monotonic()
    res = _core.CellRunner(spec).run()
    eng, wall = proc_cpu_s(pid) - eng0, time.monotonic() - wall0
    if res.fatal_error:
        raise RuntimeError(res.fatal_error)
    t0, t1 = int(res.window_start_ns), int(res.window_end_ns)
    t = np.asarray(res.events["t_ns"])
    inside = (t >= t0) & (t <= t1)
    sent = np.asarray(res.events["server_ns"])[inside]
    delay_ms = (t[inside][sent > 0] - sent[sent > 0]) / 1e6
    window_s = (t1 - t0) / 1e9
    return {
        "loops": int(res.client_threads),
        "events_s": float(np.count_nonzero(inside)) / window_s,
        "client_cores": float(res.client_cpu_s) / wall,
        "engine_cores": eng / wall,
        "events_per_client_cpu_s": float(np.count_nonzero(t >= 0)) / max(res.client_cpu_s, 1e-9),
        "p50_ms": float(np.percentile(delay_ms, 50)) if len(delay_ms) else float("nan"),
        "p99_ms": float(np.percentile(delay_ms, 99)) if len(delay_ms) else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loops", default="1,2")
    ap.add_argument("--duration", type=float, default=4.0, help="window per cell, s")
    ap.add_argument("--unpaced-streams", type=int, default=32)
    ap.add_argument("--lockstep-streams", type=int, default=512)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    raise_nofile()
    loops = [int(x) for x in args.loops.split(",") if x]
    print(
        f"loops_bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"window {args.duration:g} s per cell"
    )
    unpaced, lockstep = [], []
    with Sim("fixed", stamp=True, unpaced=True) as sim:
        for n in loops:
            unpaced.append(cell(sim, args.unpaced_streams, n, args.duration, 100_000))
            time.sleep(0.5)
    with Sim("lockstep", stamp=True) as sim:
        for n in loops:
            lockstep.append(cell(sim, args.lockstep_streams, n, args.duration, 4000))
            time.sleep(1.0)
    base = unpaced[0]
    print(
        f"\nunpaced, {args.unpaced_streams} streams | events/s | x 1 loop | client cores | "
        "engine cores | events per client CPU s | x 1 loop"
    )
    for u in unpaced:
        print(
            f"{u['loops']} loop(s) | {u['events_s']:,.0f} | {u['events_s'] / base['events_s']:.2f} | "
            f"{u['client_cores']:.2f} | {u['engine_cores']:.2f} | "
            f"{u['events_per_client_cpu_s']:,.0f} | "
            f"{u['events_per_client_cpu_s'] / base['events_per_client_cpu_s']:.2f}"
        )
    print(
        f"\nlockstep, {args.lockstep_streams} streams | events/s | delay p50 / p99 | client cores"
    )
    for s in lockstep:
        print(
            f"{s['loops']} loop(s) | {s['events_s']:,.0f} | {s['p50_ms']:.2f} / "
            f"{s['p99_ms']:.2f} ms | {s['client_cores']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"unpaced": unpaced, "lockstep": lockstep}, indent=1))


if __name__ == "__main__":
    main()
