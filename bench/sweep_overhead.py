"""Harness overhead of a sweep: wall time of a whole matrix run against the
built-in engine, next to the sum of what the cells themselves had to take
(warm-up + window). Target (issue 4): overhead at most 1 s per cell.

    python bench/sweep_overhead.py [--duration 2] [--profile fixed]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="fixed")
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--concurrency", default="1,4,16,64")
    args = ap.parse_args()

    from speedmatrix.matrix import Matrix
    from speedmatrix.sim import Sim
    from speedmatrix.sweep import Sweep

    matrix = Matrix(
        contexts=[int(c) for c in args.contexts.split(",")],
        concurrency=[int(n) for n in args.concurrency.split(",")],
        duration_s=args.duration,
        max_output=2000,
    )
    with Sim(args.profile) as sim, tempfile.TemporaryDirectory() as out:
        start = time.monotonic()
        Sweep(sim.url, matrix, out, progress=False, report=False).execute()
        wall = time.monotonic() - start
        doc = json.loads((Path(out) / "run.json").read_text())
    cells = [c for c in doc["cells"] if c["phase"] == "decode" and c.get("t1_ns")]
    needed = sum((c["t1_ns"] - c["warmup_start_ns"]) / 1e9 for c in cells)
    windows = sum((c["t1_ns"] - c["t0_ns"]) / 1e9 for c in cells)
    overhead = wall - needed
    print(f"cells measured:              {len(cells)}")
    print(f"sweep wall time:             {wall:8.2f} s")
    print(f"windows:                     {windows:8.2f} s")
    print(f"windows + warm-ups:          {needed:8.2f} s")
    print(
        f"harness overhead:            {overhead:8.2f} s  ({overhead / max(len(cells), 1):.3f} s "
        "per cell; target <= 1 s per cell)"
    )


if __name__ == "__main__":
    main()
