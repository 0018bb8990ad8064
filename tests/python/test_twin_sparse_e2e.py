"""`run --plan sparse` against the built-in engine (seed-h200, a fast prefill): the run
holds every cell of the grid, the unmeasured ones predicted and marked, their statuses and
figures those of a full run of the same grid; recompute keeps the predicted cells."""

from __future__ import annotations

import json

import pytest
import speedmatrix as sm
from speedmatrix.cli import main
from speedmatrix.sim import Sim

#: seed-h200 with a 10x faster prefill: the decode step (what the cells measure) unchanged
FAST_PREFILL = {
    "prefill_per_token_us": 8.4,
    "prefill_per_token_ctx_ns": 40.0,
    "frontend_overhead_ms": 6.0,
}
GRID = ["--contexts", "1K,4K,8K", "--concurrency", "1,8,32,128", "--prefill-contexts", "none"]


def _run(url: str, out, *extra: str) -> dict:
    argv = ["run", "--url", url, *GRID, "--duration", "2s", "--out", str(out), "--quiet"]
    assert main(argv + list(extra)) == 0
    return json.loads((out / "run.json").read_text())


@pytest.mark.e2e  # 9 + 11 short decode cells against the engine in real time (~70 s)
def test_a_sparse_run_predicts_what_a_full_run_measures(tmp_path) -> None:
    with Sim("seed-h200", overrides=FAST_PREFILL) as sim:
        # a target no fit meets: the loop measures the widest cells up to the budget
        sparse = _run(
            sim.url,
            tmp_path / "sparse",
            "--plan",
            "sparse",
            "--sparse-target",
            "0.005",
            "--sparse-max-cells",
            "9",
        )
        full = _run(sim.url, tmp_path / "full", "--no-report")
    plan = sparse["meta"]["run"]["sparse"]
    assert len(plan["design"]) == 7 and len(plan["chosen"]) == 2
    assert plan["measured"] == 9 and plan["stopped"] == "budget"
    by_id = {c["id"]: c for c in full["cells"]}
    assert {c["id"] for c in sparse["cells"]} == set(by_id)  # every cell, none twice
    predicted = [c for c in sparse["cells"] if c.get("predicted")]
    measured = [c for c in sparse["cells"] if not c.get("predicted")]
    assert len(predicted) == 2 and all("records" not in c for c in predicted)
    assert sum(c["status"] != "over_capacity" for c in measured) == 9
    for c in sparse["cells"]:
        truth = by_id[c["id"]]
        assert c["status"] == truth["status"], c["id"]
        if c.get("predicted"):
            assert c["total_tok_s"] == pytest.approx(truth["total_tok_s"], rel=0.10), c["id"]
            assert c["tbt_ms"] == pytest.approx(truth["tbt_ms"], rel=0.10), c["id"]
            assert c["total_tok_s_low"] < c["total_tok_s"] < c["total_tok_s_high"]
    report = (tmp_path / "sparse" / "report.md").read_text()
    assert "predicted" in report
    # recompute judges the measured cells from their records; predicted cells stay as saved
    assert main(["recompute", str(tmp_path / "sparse"), "--write"]) == 0
    again = {c["id"]: c for c in sm.load(tmp_path / "sparse").doc["cells"]}
    for c in predicted:
        assert again[c["id"]] == c
    for c in measured:
        assert again[c["id"]]["status"] == c["status"]
        assert not again[c["id"]].get("predicted")
