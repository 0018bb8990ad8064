"""`speedmatrix demo`: the built-in engine with the `seed-h200` profile, the
seed's matrix with a short window, and its report — no GPU needed.

The engine runs in real time, so every figure in the demo's report is measured,
not computed. Windows open at steady state (every stream decoding), so the
short window reads what the seed's 30 s window read. To fit in a few minutes on a small machine the demo's prompts of
one cell share all but their last `DEMO_UNIQUE_TAIL` tokens (the matrix's
`shared_prefix`, recorded in the run): the decode warm-ups then prefill only
the tails instead of millions of tokens. The prefill figures are still cold,
whole-prompt measurements: the first prompt of each context is uncached.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from speedmatrix.matrix import Matrix, preset_record
from speedmatrix.results import load
from speedmatrix.show import grid_text
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep
from speedmatrix.units import parse_duration

DEMO_PROFILE = "seed-h200"
DEMO_UNIQUE_TAIL = 512


def demo_matrix(duration: str | float = "3s"):

    m = Matrix.preset("seed")
    m.duration_s = duration if isinstance(duration, float) else _seconds(duration)
    m.shared_prefix = -DEMO_UNIQUE_TAIL
    return m.validate()


def preset_note(matrix) -> dict:
    """What run.json says of the demo's matrix: the seed preset, and how it differs."""

    return preset_record(matrix, "seed")


def intro_lines(matrix) -> list[str]:
    """What the demo says before it measures: how its matrix is not the seed's."""
    note = preset_note(matrix)
    return [
        f"speedmatrix demo: the seed's matrix, changed: {note['text']}.",
        (
            f"  The shared prompts let the decode warm-ups prefill {DEMO_UNIQUE_TAIL}-token tails "
            "instead of millions of tokens; prefill figures are still cold, whole prompts. "
            "speedmatrix run --preset seed shares nothing."
        ),
    ]


def _seconds(text: str) -> float:

    return parse_duration(text)


def main(out: str | Path = "speedmatrix-demo", duration: str = "3s", progress: bool = True) -> int:

    out = Path(out)
    matrix = demo_matrix(duration)
    started = time.monotonic()
    print(f"speedmatrix demo: starting the built-in engine (profile {DEMO_PROFILE})", flush=True)
    with Sim(DEMO_PROFILE) as sim:
        print(
            f"speedmatrix demo: measuring the seed's matrix against {sim.url} "
            f"({matrix.duration_s:g} s per decode cell)",
            flush=True,
        )
        for line in intro_lines(matrix):
            print(line, flush=True)
        info = {
            "preset": preset_note(matrix),
            "hardware": {
                "type": "Simulated",
                "gpu": "speedmatrix-sim (seed-h200 profile)",
                "os": sys.platform,
            },
            "engine": {"backend": "simulated"},
            "launch_command": f"speedmatrix sim --profile {DEMO_PROFILE} --port {sim.port}",
        }
        sweep = Sweep(sim.url, matrix, out, info=info, progress=progress)
        code = sweep.execute()
    run = load(out)
    print()

    print(grid_text(run, where=str(out)))
    print(f"Note: {preset_note(matrix)['text']}.")
    print(f"speedmatrix demo: done in {time.monotonic() - started:.0f} s. Files:")
    for name in ("run.json", "report.md", "report.html"):
        if (out / name).exists():
            print(f"  {out / name}")
    return code
