"""Scale-out on Ray side by side: the same closed-loop cells run in this process, on 1
shard and on 2 shards of a local two-node Ray cluster (`ray.cluster_utils.Cluster`, both
nodes on this machine), against the built-in engine.

    PYTHONPATH=python python3 bench/shards_bench.py [--streams 16,128] [--duration 5]
        [--itl-ms 20] [--rate 100]

For each cell (N streams, the engine's ``fixed`` profile: TTFT 50 ms, then a token every
ITL) it prints, per way of running it:
  total tok/s, TBT p50 / p99, TTFT p50   the pooled cell's figures (one derivation)
  client CPU s     the shards' core CPU time, summed
  cell wall s      from the driver's call to the pooled records (offsets, the common
                   start's lead, the warm-up, the window, the records' trip back)
  rtt ms           the fastest ping round trip to a shard (the clock offset's bound x2)
With --rate R, one open-loop cell too (Poisson arrivals at R/s, 50 tokens each): its one
schedule dealt round-robin over the shards; "arrivals" counts the window's requests sent.
On this machine both "nodes" share its two cores and one kernel clock (offset 0): what
it measures is the shards' overhead and that the figures agree, not a gain in capacity.
A benchmark prints figures; it does not fail on a slow machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

import ray
from ray.cluster_utils import Cluster
from speedmatrix._native import _core
from speedmatrix.records import Records
from speedmatrix.shards import driver
from speedmatrix.shards.pool import ShardPool
from speedmatrix.sim import Sim


def _spec(url: str, n: int, duration_s: float, rate: float = 0.0) -> _core.CellSpec:
    body = {"prompt": "hello", "max_tokens": 50 if rate else 4000, "ignore_eos": True}
    body["stream"] = True
    spec = _core.CellSpec()
    spec.url = url + "/v1/completions"
    spec.bodies = [json.dumps({**body, "prompt": f"p{i}"}).encode() for i in range(8)]
    spec.warmup_bodies = [json.dumps({**body, "max_tokens": 1}).encode()] * 4
    spec.concurrency = n
    spec.duration_s = duration_s
    spec.client_threads = 1
    if rate:
        spec.mode, spec.rate_per_s, spec.arrival, spec.seed = "open", rate, "poisson", 3
        spec.warmup_bodies, spec.drain_timeout_s = [], 10.0
    return spec


def _row(rec: Records, wall_s: float, rtt_ms: float | None) -> dict:
    if rec.fatal_error:
        return {"error": rec.fatal_error}
    t0, t1 = rec.window_start_ns, rec.window_end_ns
    f = _core.summarize_cell(rec.requests, rec.events, t0, t1, 1.0, -1, rec.ramp_start_ns, [0.99])
    return {
        "arrivals": f"{int((rec.requests['phase'] == 1).sum()):,}",
        "total tok/s": f"{f['total_tok_s']:,.0f}",
        "TBT p50 ms": f"{f['tbt_ms']:.2f}",
        "TBT p99 ms": f"{f['tbt_p99_ms']:.2f}",
        "TTFT p50 ms": f"{f['ttft_ms']:.1f}",
        "client CPU s": f"{rec.client_cpu_s:.2f}",
        "cell wall s": f"{wall_s:.2f}",
        "rtt ms": "-" if rtt_ms is None else f"{rtt_ms:.2f}",
    }


def _local(url: str, n: int, d: float, rate: float = 0.0) -> dict:
    start = time.monotonic()
    rec = Records.from_result(_core.CellRunner(_spec(url, n, d, rate)).run())
    return _row(rec, time.monotonic() - start, None)


def _sharded(address: str, k: int, url: str, n: int, d: float, rate: float = 0.0) -> dict:
    pool = ShardPool(address, k)
    try:
        rtt_ms = max(pool.offset(i).rtt_ns for i in range(k)) / 1e6
        start = time.monotonic()
        rec, _ = driver.measure(pool, _spec(url, n, d, rate), None)
        return _row(rec, time.monotonic() - start, rtt_ms)
    finally:
        pool.close()


def _print(cols: dict[str, dict]) -> None:
    names = list(next(iter(cols.values())))
    print(f"{'':>14}" + "".join(f"{c:>14}" for c in cols))
    for name in names:
        print(f"{name:>14}" + "".join(f"{r.get(name, '-'):>14}" for r in cols.values()))
    for c, r in cols.items():
        if "error" in r:
            print(f"{c}: {r['error']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="16,128")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=0.0, help="an open-loop cell too (req/s)")
    args = ap.parse_args()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    try:
        with Sim("fixed", overrides={"fixed_itl_ms": args.itl_ms}) as sim:
            cells = [(int(x), 0.0) for x in args.streams.split(",")]
            cells += [(1, args.rate)] if args.rate else []
            for n, rate in cells:
                cols = {
                    "in process": _local(sim.url, n, args.duration, rate),
                    "1 shard": _sharded(cluster.address, 1, sim.url, n, args.duration, rate),
                    "2 shards": _sharded(cluster.address, 2, sim.url, n, args.duration, rate),
                }
                what = f"open loop {rate:g}/s" if rate else f"{n} streams"
                print(f"\n{what}, ITL {args.itl_ms:g} ms, window {args.duration:g} s")
                _print(cols)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
