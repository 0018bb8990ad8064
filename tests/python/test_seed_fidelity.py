"""The `seed-h200` profile against the seed report (tests/data/seed_report.txt):
speedmatrix's own measurement of the built-in engine must land within 10% of
the real H200's figures, which the seed measured over 30 s windows.

Every reproducible seed decode cell (21; `seed.reproducible`, the rule shared with
bench/sim_bench.py) is held to the seed in virtual time by the engine model's own
test, tests/cpp/test_sim_fidelity.cpp (under a second). Here, in real time through
the HTTP server and the client, a few cells spread over the matrix (one per context
band, small to large batches) and every prefill context: about three minutes.
"""

from __future__ import annotations

import json

import pytest
from seed import label_tokens, reproducible, seed_cells, seed_over_capacity
from speedmatrix.adapters import discover
from speedmatrix.matrix import Matrix
from speedmatrix.plan import plan
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep
from speedmatrix.units import format_tokens

# End-to-end tier: the seed matrix with its 30 s windows.
pytestmark = pytest.mark.e2e

# (context label, concurrency) of the seed decode cells measured here in real time; every
# reproducible one is checked in virtual time (tests/cpp/test_sim_fidelity.cpp).
CELLS = [("8K", 8), ("32K", 32), ("123K", 1)]
assert all(
    any((c.label, c.concurrency) == cell and reproducible(c) for c in seed_cells())
    for cell in CELLS
)


def _seed():
    return {(c.phase, c.label, c.concurrency): c for c in seed_cells()}


def test_over_capacity_set_is_the_seeds():
    with Sim("seed-h200") as sim:
        planned = plan(Matrix.preset("seed"), discover(sim.url))
    ours = {
        (c.label, c.concurrency)
        for c in planned
        if c.phase == "decode" and c.status == "over_capacity"
    }
    assert ours == seed_over_capacity()
    decode_labels = {c.label for c in planned if c.phase == "decode"}
    assert decode_labels == {"8K", "16K", "32K", "64K", "123K"}
    prefill_labels = [c.label for c in planned if c.phase == "prefill"]
    assert prefill_labels == ["8K", "16K", "32K", "64K", "123K", "128K"]


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed")
    results = {}
    with Sim("seed-h200") as sim:
        target = discover(sim.url)
        # Prefill: every seed context, cold, one request each.
        m = Matrix(
            contexts=[8192],
            concurrency=[1],
            duration_s=1,
            max_output=4096,
            prefill_contexts=[8192, 16384, 32768, 65536, "max-decode", "max"],
            prefill_mode="separate",
        )
        Sweep(sim.url, m, out / "prefill", progress=False, report=False, target=target).execute()
        results["prefill"] = json.loads((out / "prefill" / "run.json").read_text())["cells"]
        # Decode: a 5 s steady-state window and the seed's max output; prompts of a cell
        # share all but their last 512 tokens so warm-ups do not prefill millions of tokens.
        for label, n in CELLS:
            m = Matrix(
                contexts=[label_tokens(label)],
                concurrency=[n],
                duration_s=5,
                max_output=4096,
                shared_prefix=-512,
            )
            d = out / f"{label}-{n}"
            Sweep(sim.url, m, d, progress=False, report=False, target=target).execute()
            cells = json.loads((d / "run.json").read_text())["cells"]
            results[(label, n)] = next(c for c in cells if c["phase"] == "decode")
    return results


@pytest.mark.parametrize("label, n", CELLS)
def test_decode_within_10_percent_of_the_seed(seed_run, label, n):
    ref = _seed()[("decode", label, n)]
    cell = seed_run[(label, n)]
    assert cell["status"] in ("valid", "queued"), cell
    assert cell["total_tok_s"] == pytest.approx(ref.total_tok_s, rel=0.10), cell
    assert cell["per_request_tok_s"] == pytest.approx(ref.per_request_tok_s, rel=0.10), cell
    assert cell["avg_active"] == pytest.approx(n, rel=0.02)


def test_prefill_within_10_percent_of_the_seed(seed_run):
    seed = _seed()
    cells = {format_tokens(c["context"]): c for c in seed_run["prefill"] if c["phase"] == "prefill"}
    assert set(cells) == {"8K", "16K", "32K", "64K", "123K", "128K"}
    for label, cell in cells.items():
        ref = seed[("prefill", label, 1)]
        assert cell["status"] == "valid"
        assert cell["prompt_tok_s"] == pytest.approx(ref.total_tok_s, rel=0.10), label
        assert cell["ttft_ms"] == pytest.approx(ref.ttft_ms, rel=0.10), label
