"""Request-rate matrices: the plan's cells (contexts x rates) and their shape."""

from __future__ import annotations

from speedmatrix.matrix import Matrix
from speedmatrix.plan import OPEN_LOOP_PROMPTS, plan


def test_rates_make_contexts_x_rates_cells_with_a_prompt_per_arrival():
    m = Matrix(
        contexts=[1024, 4096],
        concurrency=[1, 2, 4],
        request_rates="0.5,2",
        duration_s=10,
        max_output=64,
        arrival="gamma:0.5",
        drain_timeout_s=30,
        prefill_contexts=[],
    )
    cells = plan(m, None, kv_tokens=1_000_000, context_length=8192)
    dec = [c for c in cells if c.phase == "decode"]
    assert [c.id for c in dec] == [
        "decode-c1024-q0.5-r0",
        "decode-c1024-q2-r0",
        "decode-c4096-q0.5-r0",
        "decode-c4096-q2-r0",
    ]
    c = dec[1]
    assert c.rate_per_s == 2.0 and c.arrival == "gamma:0.5" and c.drain_timeout_s == 30.0
    assert c.concurrency == 0 and c.runnable and not c.warmup
    assert 20 + 4 * 20**0.5 < c.prompt_count <= 20 + 4 * 20**0.5 + 9  # mean + 4 sd + 8
    assert (
        plan(Matrix(contexts=[64], request_rates=[1e6], duration_s=60), None)[0].prompt_count
        == OPEN_LOOP_PROMPTS
    )


def test_the_gate_bounds_the_kv_check():
    m = Matrix(contexts=[4096], request_rates=[4], max_concurrency=64, max_output=1024)
    (cell,) = plan(m, None, kv_tokens=100_000, context_length=8192)
    assert cell.status == "over_capacity" and "64 ×" in cell.reason
    m.max_concurrency = 0  # no gate: the schedule decides, nothing is refused beforehand
    (cell,) = plan(m, None, kv_tokens=100_000, context_length=8192)
    assert cell.runnable


def test_search_plans_no_decode_grid_and_cells_on_demand():
    from speedmatrix.plan import search_cell

    m = Matrix(contexts=[1024], concurrency=[2], search="concurrency", slo="ttft=1s")
    planned = plan(m, None, kv_tokens=50_000, context_length=8192)
    assert [c for c in planned if c.phase == "decode"] == []
    cell = search_cell(m, planned, 1024, 8)
    assert cell.id == "decode-c1024-n8-r0" and cell.runnable and cell.prompt_count == 8
    assert not search_cell(m, planned, 1024, 64).runnable  # 64 x (1024 + 4096) > 50,000
    m = Matrix(contexts=[1024], request_rates=[2], search="rate", slo="ttft=1s")
    cell = search_cell(m, plan(m, None), 1024, 3.5)
    assert cell.id == "decode-c1024-q3.5-r0" and cell.rate_per_s == 3.5


def test_search_needs_an_slo_and_a_start():
    assert any("needs an SLO" in p for p in Matrix(search="concurrency").problems())
    assert any("starting rate" in p for p in Matrix(search="rate", slo="e2e=1s").problems())
    assert any(
        "search rate instead" in p
        for p in Matrix(search="concurrency", slo="e2e=1s", request_rates=[1]).problems()
    )
