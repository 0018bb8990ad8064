"""The twin's engine model against the seed report (a real SGLang H200 run) via seed-h200."""

from __future__ import annotations

import pytest
from seed import label_tokens, reproducible, seed_cells
from speedmatrix.sim import load_profile
from speedmatrix.twin import predict_cell, predict_matrix
from speedmatrix.twin.model import ProfileError, cold_ttft_ms, slot_passes, status
from speedmatrix.twin.predictrun import predicted_cell

K = 1024
CONTEXTS = [8 * K, 16 * K, 32 * K, 64 * K, 123 * K]
CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128]


@pytest.fixture(scope="module")
def profile():
    return load_profile("seed-h200")


def test_decode_figures_within_10_percent_of_the_seed(profile) -> None:
    cells = [c for c in seed_cells() if c.phase == "decode" and reproducible(c)]
    assert len(cells) >= 10
    for c in cells:
        p = predict_cell(profile, label_tokens(c.label), c.concurrency)
        # the seed flags some of these "Requests queued" from work left over by earlier cells,
        # which an engine model has not: every one fits in the pool and the running limit
        assert p.predicted and p.status == "valid"
        assert p.total_tok_s == pytest.approx(c.total_tok_s, rel=0.10), c.label
        assert p.tbt_ms == pytest.approx(c.tbt_ms, rel=0.10), c.label


def test_over_capacity_cells_are_exactly_the_seed(profile) -> None:
    seed_over = {
        (label_tokens(c.label), c.concurrency)
        for c in seed_cells()
        if c.phase == "decode" and c.status == "over_capacity"
    }
    over = {
        (p.context, p.concurrency)
        for p in predict_matrix(profile, CONTEXTS, CONCURRENCY)
        if p.status == "over_capacity"
    }
    assert seed_over and over == seed_over


def test_prefill_within_10_percent_of_the_seed(profile) -> None:
    for c in seed_cells():
        if c.phase == "prefill":
            assert cold_ttft_ms(profile, label_tokens(c.label)) == pytest.approx(
                c.ttft_ms, rel=0.10
            )


def test_interval_brackets_the_point_and_widens_with_uncertainty(profile) -> None:
    point = predict_cell(profile, 8 * K, 16)
    assert point.total_tok_s_low == point.total_tok_s == point.total_tok_s_high
    sd = {"step_base_ms": 1.0, "step_per_kv_token_ns": 0.2}
    p = predict_cell(profile, 8 * K, 16, sd=sd)
    assert p.total_tok_s_low < p.total_tok_s < p.total_tok_s_high
    assert p.tbt_ms_low < p.tbt_ms < p.tbt_ms_high


@pytest.mark.parametrize(
    ("context", "n", "max_running", "expected"),
    [(8 * K, 4, 256, "valid"), (8 * K, 8, 4, "queued"), (123 * K, 16, 256, "over_capacity")],
)
def test_status_table(profile, context, n, max_running, expected) -> None:
    assert status({**profile, "max_running": max_running}, context, n, 4096) == expected


@pytest.mark.parametrize(
    ("context", "n", "expected"),
    [(1024, 4, "valid"), (1024, 5, "queued"), (2048, 1, "over_capacity"), (1920, 6, "queued")],
)
def test_status_follows_the_measured_servers_slot_rule(profile, context, n, expected) -> None:
    """llama.cpp's split slots (4 x 2048 tokens, 128 out): a request over its slot is over
    capacity at any concurrency (a shared pool of the same 8192 tokens would hold it); more
    requests than slots queue."""
    slots = {
        **profile,
        "kv_tokens": 4 * 2048,
        "max_running": 4,
        "block_size": 1,
        "fit": {"capacity": {"family": "per_slot", "slot_tokens": 2048}},
    }
    assert status(slots, context, n, 128) == expected
    assert status({**slots, "fit": {}}, 2048, 1, 128) == "valid"


def test_missing_parameter_is_one_clear_error(profile) -> None:
    bad = {k: v for k, v in profile.items() if k != "step_base_ms"}
    with pytest.raises(ProfileError, match="step_base_ms"):
        predict_cell(bad, 8 * K, 4)


@pytest.mark.parametrize(
    ("family", "slots", "concurrency", "expected"),
    [
        ("per_slot", 4, 1, 1),  # one request: one pass
        ("per_slot", 4, 2, 2),  # slots 0 and 2: two micro-batches
        ("per_slot", 4, 3, 2),  # slots 0, 1 and 3: {0, 1} then {3}
        ("per_slot", 4, 4, 1),  # every slot busy: consecutive
        ("per_slot", 4, 6, 1),  # more requests than slots: the slots run full
        ("per_slot", 0, 2, 1),  # slots not known
        ("per_slot", 8, 4, 4),  # 0, 2, 4, 6
        ("per_slot", 8, 6, 3),  # 0, 1, 3, 4, 6, 7: three runs of consecutive slots
        ("unified_slots", 4, 2, 1),  # one stream: split_simple keeps the batch whole
        ("shared_pool", 4, 2, 1),
        (None, 4, 2, 1),
    ],
)
def test_the_passes_a_split_slot_step_may_take(family, slots, concurrency, expected) -> None:
    assert slot_passes(family, slots, concurrency) == expected


def test_a_partly_busy_split_slot_cell_spans_one_to_several_passes(profile) -> None:
    """llama.cpp's split slots, 2 of 4 busy: the point is one pass; the interval reaches from
    one request's step to two passes of one request each or a full batch's step, whichever
    is slower, and the cell says why."""
    slots = {
        **profile,
        "kv_tokens": 4 * 2048,
        "max_running": 4,
        "fit": {"capacity": {"family": "per_slot", "slot_tokens": 2048}},
    }
    one = predict_cell(slots, 1024, 1, max_output=64, window_s=2.0)
    two = predict_cell(slots, 1024, 2, max_output=64, window_s=2.0)
    full = predict_cell(slots, 1024, 4, max_output=64, window_s=2.0)
    assert (one.slot_passes, two.slot_passes, full.slot_passes) == (1, 2, 1)
    assert two.tbt_ms_low == pytest.approx(one.tbt_ms, rel=1e-4)
    # two passes of one request (each attends a little less: the step is slower)
    slowest = max(2 * one.tbt_ms, full.tbt_ms)
    assert two.tbt_ms < two.tbt_ms_high == pytest.approx(slowest, rel=1e-4)
    assert "1 to 2 forward passes" in predicted_cell(two, 4, 2.0)["reason"]
    assert predicted_cell(full, 4, 2.0)["reason"] == "predicted, not measured"
