"""The seed's matrix against the built-in `seed-h200` engine, twice: with precision-driven
windows (`--precision 2%`, capped at 30 s) and with fixed 30 s windows. Prints each run's
wall time, the time its decode windows took, how each cell stopped, and both runs' figures
against the seed report (bench/seed_compare.py).

    PYTHONPATH=python python bench/precision_bench.py [--only precision|fixed] [--out DIR]

The goal (issue 12): the matrix at +-2% in at most a third of the time of 30 s windows,
every figure within 10% of the seed. Real time: the fixed run alone is ~20 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def run(kind: str, out: Path) -> dict:
    from speedmatrix.demo import DEMO_PROFILE, demo_matrix
    from speedmatrix.sim import Sim
    from speedmatrix.sweep import Sweep

    m = demo_matrix(30.0)
    if kind == "precision":
        m.precision = 0.02
    m.validate()
    started = time.monotonic()
    with Sim(DEMO_PROFILE) as sim:
        Sweep(sim.url, m, out, progress=False, report=False).execute()
    wall = time.monotonic() - started
    cells = json.loads((out / "run.json").read_text())["cells"]
    decode = [c for c in cells if c["phase"] == "decode" and c.get("measured_s")]
    return {
        "wall_s": wall,
        "window_s": sum(c["measured_s"] for c in decode),
        "ramp_s": sum(c.get("ramp_s") or 0 for c in decode),
        "stopped_by": {
            k: sum(1 for c in decode if c.get("stopped_by") == k) for k in ("precision", "duration")
        },
        "precision_max": max((c.get("precision") or 0) for c in decode) if decode else None,
    }


def main() -> int:
    import seed_compare

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["precision", "fixed"])
    ap.add_argument("--out", type=Path, default=Path("/tmp/speedmatrix-precision-bench"))
    a = ap.parse_args()
    kinds = [a.only] if a.only else ["precision", "fixed"]
    results = {}
    for kind in kinds:
        out = a.out / kind
        results[kind] = run(kind, out)
        print(f"\n== {kind}: {json.dumps(results[kind])}")
        seed_compare.main([str(out)])
    if len(results) == 2:
        ratio = results["precision"]["wall_s"] / results["fixed"]["wall_s"]
        print(f"\nprecision run / fixed run, wall time: {ratio:.2f} (goal: at most 0.33)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
