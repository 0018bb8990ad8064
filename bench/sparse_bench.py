"""`run --plan sparse` against `--plan full`, side by side on the built-in engine (issue 24).

    PYTHONPATH=python python3 bench/sparse_bench.py [--contexts 1K,2K,4K,8K]
        [--concurrency 1,4,8,16,32,64,128] [--duration 3s] [--target 0.10]

Both runs measure the same grid against one `speedmatrix-sim` (seed-h200 with a 10x faster
prefill, so warm-ups do not dominate a short window), full first. Printed: each run's wall
time and decode cells measured, the time ratio, and over the cells the sparse run predicted
the largest relative error of total tok/s and time between tokens against the full run's
measurement, and how many statuses agree. A benchmark prints figures; it does not fail.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from speedmatrix.cli import main
from speedmatrix.sim import Sim

FAST_PREFILL = {
    "prefill_per_token_us": 8.4,
    "prefill_per_token_ctx_ns": 40.0,
    "frontend_overhead_ms": 6.0,
}


def _run(url: str, out: Path, args: argparse.Namespace, *extra: str) -> tuple[float, dict]:
    argv = ["run", "--url", url, "--contexts", args.contexts, "--concurrency", args.concurrency]
    argv += ["--prefill-contexts", "none", "--duration", args.duration, "--out", str(out)]
    argv += ["--quiet", "--no-report", *extra]
    t0 = time.monotonic()
    code = main(argv)
    wall_s = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f"sparse_bench: run exited {code}")
    return wall_s, json.loads((out / "run.json").read_text())


def main_bench() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="1K,2K,4K,8K")
    p.add_argument("--concurrency", default="1,4,8,16,32,64,128")
    p.add_argument("--duration", default="3s")
    p.add_argument("--target", default="0.10")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Sim("seed-h200", overrides=FAST_PREFILL) as sim:
        full_s, full = _run(sim.url, Path(tmp) / "full", args)
        sparse_s, sparse = _run(
            sim.url, Path(tmp) / "sparse", args, "--plan", "sparse", "--sparse-target", args.target
        )
    truth = {c["id"]: c for c in full["cells"]}
    decode = [c for c in full["cells"] if c["status"] != "over_capacity"]
    predicted = [c for c in sparse["cells"] if c.get("predicted")]
    agree = sum(c["status"] == truth[c["id"]]["status"] for c in sparse["cells"])
    err = {"total_tok_s": 0.0, "tbt_ms": 0.0}
    for c in predicted:
        for key in ("total_tok_s", "tbt_ms"):
            if c.get(key) and truth[c["id"]].get(key):
                err[key] = max(err[key], abs(c[key] / truth[c["id"]][key] - 1))
    plan = sparse["meta"]["run"]["sparse"]
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), cores: {os.cpu_count()}")
    print(f"grid: {args.contexts} x {args.concurrency}, {args.duration} windows, seed-h200")
    print(f"{'':>8} {'wall s':>8} {'measured':>9} {'predicted':>10}")
    print(f"{'full':>8} {full_s:>8.1f} {len(decode):>9} {0:>10}")
    print(f"{'sparse':>8} {sparse_s:>8.1f} {plan['measured']:>9} {len(predicted):>10}")
    print(f"time sparse / full: {sparse_s / full_s:.0%} (stopped: {plan['stopped']})")
    print(
        f"predicted vs measured, max error: total tok/s {err['total_tok_s']:.2%}, "
        f"TBT {err['tbt_ms']:.2%}; statuses agree {agree}/{len(sparse['cells'])}"
    )


if __name__ == "__main__":
    main_bench()
