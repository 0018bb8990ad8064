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


def test_the_cells_frame_carries_latency_slo_and_open_loop_columns(tmp_path):
    from speedmatrix.results import Run

    cell = {
        "id": "decode-c256-q8-r0", "phase": "decode", "context": 256, "label": "256",
        "concurrency": 0, "status": "valid", "rate_per_s": 8.0, "ttft_p90_ms": 41.0,
        "latency": {
            "e2e_ms": {"n": 20, "mean": 210.0, "median": 200.0, "p99": 300.0, "ci": {}},
            "ttft_ms": {"n": 20, "p90": 45.0, "p99.9": None},
            "percentiles": [90, 99, 99.9],
        },
        "slo": {"attainment": 0.9, "goodput_req_s": 7.2},
        "open_loop": {"achieved_rate_per_s": 8.1, "kept_up": True},
    }  # fmt: skip
    df = Run({"schema": "speedmatrix.run/1", "meta": {}, "cells": [cell]}).cells
    row = df.iloc[0]
    # a stored median without its p50 is the p50 (one name per figure)
    assert row["e2e_n"] == 20 and row["e2e_p99_ms"] == 300.0 and row["e2e_p50_ms"] == 200.0
    assert row["ttft_p90_ms"] == 41.0  # the core's own figure, over the requests sent
    assert row["ttft_completed_p90_ms"] == 45.0  # over the completed requests: its own name
    assert row["slo_attainment"] == 0.9 and row["open_loop_achieved_rate_per_s"] == 8.1
    assert row["rate_per_s"] == 8.0


def test_load_matrix_pivots_rate_cells_by_rate_and_prints_as_markdown():
    from speedmatrix import slo
    from speedmatrix.results import Run

    def cell(ctx, rate, att, status="valid", rep=0):
        return {
            "id": f"decode-c{ctx}-q{rate:g}-r{rep}", "phase": "decode", "context": ctx,
            "label": f"{ctx // 1024}K", "concurrency": 0, "repetition": rep,
            "status": status, "rate_per_s": rate, "slo": {"attainment": att},
        }  # fmt: skip

    cells = [cell(8192, 1.0, 1.0), cell(8192, 4.0, 0.5), cell(8192, 4.0, 0.7, rep=1),
             cell(16384, 1.0, 0.9), cell(16384, 4.0, None, status="error")]  # fmt: skip
    run = Run({"schema": "speedmatrix.run/1", "meta": {}, "cells": cells})
    df = run.load_matrix("slo_attainment")
    assert list(df.columns) == [1.0, 4.0] and df.columns.name == "request_rate"
    assert df.loc["8K", 4.0] == 0.6  # the median of two repetitions
    assert df.loc["16K", 4.0] == "Error"
    md = slo.markdown_matrix(df, "Attainment")
    assert "| 8K | 1 | 0.6 |" in md and "| 16K | 0.9 | Error |" in md
    assert run.load_matrix("slo_attainment", numeric=True).isna().sum().sum() == 1
