"""The twin's model against the built-in engine it mirrors (seed-h200, truth known)."""

from __future__ import annotations

import json

import pytest
import speedmatrix as sm
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


#: seed-h200 with a 10x faster prefill: the decode step (what the cells measure) unchanged,
#: the warm-ups short enough for a test
FAST_PREFILL = {
    "prefill_per_token_us": 8.4,
    "prefill_per_token_ctx_ns": 40.0,
    "frontend_overhead_ms": 6.0,
}


@pytest.mark.e2e  # six 3 s decode cells against the engine in real time (~60 s)
def test_fit_from_the_engines_records_predicts_a_held_out_cell(tmp_path) -> None:
    out = tmp_path / "run"
    with Sim("seed-h200", overrides=FAST_PREFILL) as sim:
        argv = ["run", "--url", sim.url, "--contexts", "1K,8K", "--concurrency", "1,16,64"]
        argv += ["--prefill-contexts", "none", "--duration", "3s", "--out", str(out)]
        argv += ["--no-report", "--quiet"]
        assert main(argv) == 0
    assert main(["fit", str(out), "-o", str(tmp_path / "fit.json")]) == 0
    fitted = json.loads((tmp_path / "fit.json").read_text())
    truth = load_profile("seed-h200")
    assert fitted["step_base_ms"] == pytest.approx(truth["step_base_ms"], rel=0.05)
    assert fitted["kv_tokens"] == truth["kv_tokens"] and fitted["max_running"] == 256
    run = sm.load(out)
    held = "decode-c8192-n16-r0"
    doc = {**run.doc, "cells": [c for c in run.doc["cells"] if c["id"] != held]}
    profile = sm.fit(sm.Run(doc, out))
    assert held not in profile["fit"]["cells"] and len(profile["fit"]["cells"]) == 5
    (pred,) = sm.predict(profile, [8192], [16]).doc["cells"]
    measured = run.cell(held)
    assert pred["status"] == measured["status"] == "valid"
    assert pred["total_tok_s"] == pytest.approx(measured["total_tok_s"], rel=0.05)
    assert pred["tbt_ms"] == pytest.approx(measured["tbt_ms"], rel=0.05)
