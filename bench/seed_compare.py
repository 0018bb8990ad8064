"""Compares a run of the seed matrix (a `speedmatrix demo` output, or any run.json of the
seed-h200 engine) with the seed report: every reproducible seed decode cell's total and
per-request tok/s, every prefill figure, and the over-capacity set. Prints one line per
cell and the worst deviations.

    PYTHONPATH=python:tests/python python bench/seed_compare.py DIR [DIR ...]

Several DIRs (runs of parts of the matrix) are merged, later ones winning.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from seed import reproducible, seed_cells, seed_over_capacity
from speedmatrix.units import format_tokens


def _cells(dirs: list[str]) -> dict:
    out = {}
    for d in dirs:
        doc = json.loads((Path(d) / "run.json").read_text())
        for c in doc["cells"]:
            out[(c["phase"], format_tokens(c["context"]), c["concurrency"])] = c
    return out


def _dev(ours, ref):
    if ours is None or ref in (None, 0):
        return None
    return ours / ref - 1


def main(dirs: list[str]) -> int:
    ours = _cells(dirs)
    worst = {"total": 0.0, "per_request": 0.0, "prefill": 0.0}
    missing = 0
    print(f"{'cell':<16}{'total ours/seed':>24}{'dev':>8}{'per-req ours/seed':>22}{'dev':>8}")
    for s in seed_cells():
        key = (s.phase, s.label, s.concurrency)
        c = ours.get(key)
        if s.phase == "prefill":
            if c is None:
                missing += 1
                continue
            d = _dev(c.get("prompt_tok_s"), s.total_tok_s)
            print(
                f"prefill {s.label:<8}{c.get('prompt_tok_s') or 0:>12,.0f}/{s.total_tok_s:>10,.0f}"
                f"{(d or 0) * 100:>+7.1f}%"
            )
            worst["prefill"] = max(worst["prefill"], abs(d or 0))
            continue
        if not reproducible(s):
            continue
        if c is None:
            missing += 1
            print(f"{s.label} x {s.concurrency}: not in the run")
            continue
        dt = _dev(c.get("total_tok_s"), s.total_tok_s)
        dp = _dev(c.get("per_request_tok_s"), s.per_request_tok_s)
        extra = (
            f"  decode/req {c.get('decode_tok_s_per_request') or 0:.1f}"
            f"  ramp {c.get('ramp_s') or 0:.2f}s  D {c.get('measured_s') or 0:.1f}s"
            f"  {c.get('stopped_by', '')}  {c.get('status')} {','.join(c.get('flags', []))}"
        )
        print(
            f"{s.label + ' x ' + str(s.concurrency):<16}"
            f"{c.get('total_tok_s') or 0:>12,.1f}/{s.total_tok_s:>10,.1f}{(dt or 0) * 100:>+7.1f}%"
            f"{c.get('per_request_tok_s') or 0:>11,.1f}/{s.per_request_tok_s:>9,.1f}"
            f"{(dp or 0) * 100:>+7.1f}%{extra}"
        )
        worst["total"] = max(worst["total"], abs(dt if dt is not None else 1))
        worst["per_request"] = max(worst["per_request"], abs(dp if dp is not None else 1))
    over = {
        (lbl, n)
        for (ph, lbl, n), c in ours.items()
        if ph == "decode" and c.get("status") == "over_capacity"
    }
    print(
        f"over capacity: {'the seed set' if over == seed_over_capacity() else 'DIFFERS'}"
        f" ({len(over)} cells)"
    )
    print(
        "worst deviation: "
        + ", ".join(f"{k} {v * 100:.1f}%" for k, v in worst.items())
        + (f"; {missing} cells missing" if missing else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
