"""The twin's model against the built-in engine it mirrors (seed-h200, truth known)."""

from __future__ import annotations

import json

import pytest
from speedmatrix.cli import main
from speedmatrix.sim import Sim, load_profile
from speedmatrix.twin import predict_cell

WINDOW_S = 4.0


@pytest.mark.e2e  # two short decode cells against the engine in real time (~40 s)
def test_predicted_cells_match_the_engine_within_10_percent(tmp_path) -> None:
    out = tmp_path / "run"
    with Sim("seed-h200") as sim:
        argv = ["run", "--url", sim.url, "--contexts", "8K", "--concurrency", "4,32"]
        argv += ["--prefill-contexts", "none", "--duration", "4s", "--out", str(out)]
        assert main(argv) == 0
    cells = json.loads((out / "run.json").read_text())["cells"]
    profile = load_profile("seed-h200")
    assert len(cells) == 2
    for c in cells:
        p = predict_cell(profile, c["context"], c["concurrency"], window_s=WINDOW_S)
        assert p.status == c["status"] == "valid"
        assert p.total_tok_s == pytest.approx(c["total_tok_s"], rel=0.10)
        assert p.tbt_ms == pytest.approx(c["tbt_ms"], rel=0.10)
