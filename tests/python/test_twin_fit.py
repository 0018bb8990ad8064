"""Fit the step from at most 10 of the seed report's measured cells, predict the others."""

from __future__ import annotations

import pytest
from seed import label_tokens, reproducible, seed_cells
from speedmatrix.sim import load_profile
from speedmatrix.twin import predict_cell
from speedmatrix.twin.fit import MeasuredCell, fit_step
from speedmatrix.twin.model import STEP_KEYS, ProfileError


def _measured() -> list[MeasuredCell]:
    return [
        MeasuredCell(label_tokens(c.label), c.concurrency, c.total_tok_s, c.tbt_ms)
        for c in seed_cells()
        if c.phase == "decode" and reproducible(c)
    ]


def test_fit_from_10_cells_predicts_the_rest_within_10_percent() -> None:
    cells = _measured()
    chosen = cells[:: max(1, len(cells) // 10)][:10]
    assert 3 <= len(chosen) <= 10 and len(cells) > len(chosen)
    base = load_profile("seed-h200")
    fit = fit_step({k: v for k, v in base.items() if k not in STEP_KEYS}, chosen)
    assert set(fit.sd) == set(STEP_KEYS) and all(s >= 0 for s in fit.sd.values())
    assert max(abs(r) for r in fit.residuals.values()) < 0.10
    held_out = [c for c in cells if c not in chosen]
    for c in held_out:
        p = predict_cell(fit.profile, c.context, c.concurrency, sd=fit.sd)
        assert p.total_tok_s == pytest.approx(c.total_tok_s, rel=0.10), (c.context, c.concurrency)
        assert p.tbt_ms == pytest.approx(c.tbt_ms, rel=0.10), (c.context, c.concurrency)
        assert p.tbt_ms_low <= p.tbt_ms <= p.tbt_ms_high


def test_too_few_cells_is_one_clear_error() -> None:
    with pytest.raises(ProfileError, match="3 valid cells"):
        fit_step(load_profile("seed-h200"), _measured()[:2])


#: six cells measured on llama.cpp (one thread, a loaded machine): at 1920 x 6 the batch is
#: still 4 (the slots), yet the figures are noisy enough that an unconstrained fit makes the
#: per-request term negative, and with it the step of a batch of 2 at 128 tokens
NOISY_LLAMACPP = [
    MeasuredCell(128, 1, 374.5, 1.9),
    MeasuredCell(128, 4, 510.5, 5.7),
    MeasuredCell(128, 6, 374.5, 11.3),
    MeasuredCell(1920, 1, 195.5, 3.8),
    MeasuredCell(1920, 4, 270.5, 12.3),
    MeasuredCell(1920, 6, 296.5, 12.4),
]


@pytest.mark.parametrize("window_s", [2.0, 30.0])
def test_no_step_term_is_fitted_negative_so_no_cell_is_predicted_negative(window_s) -> None:
    base = {"max_running": 4, "kv_tokens": 8192, "chunk_tokens": 2048}
    fit = fit_step(base, NOISY_LLAMACPP, window_s=window_s)
    assert all(fit.profile[k] >= 0 for k in STEP_KEYS), {k: fit.profile[k] for k in STEP_KEYS}
    assert all(fit.sd[k] >= 0 for k in STEP_KEYS)
    for context in (128, 512, 1024, 1920):
        for n in (1, 2, 3, 4, 6):
            p = predict_cell(fit.profile, context, n, max_output=64, sd=fit.sd)
            assert p.tbt_ms > 0 and p.total_tok_s > 0, (context, n, p)


def _fit_the_design(truth: dict) -> tuple[dict, list[MeasuredCell]]:
    """The 4 x 4 llama.cpp-shaped grid predicted from ``truth`` (the measured cells), and the
    profile fitted to its `DESIGN` cells."""
    measured = []
    for c, n in [(c, n) for c in (128, 512, 1024, 1920) for n in (1, 2, 3, 4)]:
        p = predict_cell(truth, c, n, max_output=64, window_s=2.0)
        measured.append(MeasuredCell(c, n, p.total_tok_s, p.tbt_ms))
    design = [m for m in measured if (m.context, m.concurrency) in DESIGN]
    base = {k: v for k, v in truth.items() if k not in STEP_KEYS}
    return fit_step(base, design, window_s=2.0, max_output=64).profile, measured


def _assert_predicts(profile: dict, measured: list[MeasuredCell]) -> None:
    for m in measured:
        p = predict_cell(profile, m.context, m.concurrency, max_output=64, window_s=2.0)
        assert p.tbt_ms == pytest.approx(m.tbt_ms, rel=0.01), (m.context, m.concurrency)


def test_a_faster_one_sequence_path_is_fitted_as_the_batched_surcharge() -> None:
    # llama.cpp on a CPU: a step of 2 costs ~2.7x a step of 1, then grows gently; three batch
    # sizes with batch 1 among them pin the surcharge instead of a square term
    truth = {
        "step_base_ms": 1.0,
        "step_per_seq_ms": 0.4,
        "step_per_seq2_ms": 0.0,
        "step_per_kv_token_ns": 300.0,
        "step_batched_ms": 2.5,
        "max_running": 4,
        "kv_tokens": 8192,
    }
    fitted, measured = _fit_the_design(truth)
    assert fitted["step_batched_ms"] == pytest.approx(2.5, rel=0.02)
    assert fitted["step_per_seq2_ms"] == 0.0
    _assert_predicts(fitted, measured)


#: the first five cells of the sparse design of that grid (speedmatrix.twin.sparse.design)
DESIGN = {(128, 1), (1920, 4), (128, 4), (128, 2), (1920, 1)}


def test_a_step_cost_per_token_of_context_is_fitted_as_the_context_term() -> None:
    # llama.cpp on a CPU: the step grows ~3 µs per token of context at a batch of 1 and at
    # a batch of 4 alike, not 4x as fast: the per-step context term, not the per-sequence KV
    truth = {
        "step_base_ms": 0.2,
        "step_per_seq_ms": 1.2,
        "step_per_seq2_ms": 0.0,
        "step_per_kv_token_ns": 0.0,
        "step_batched_ms": 0.8,
        "step_per_ctx_token_ns": 3000.0,
        "max_running": 4,
        "kv_tokens": 8192,
    }
    fitted, measured = _fit_the_design(truth)
    assert fitted["step_per_ctx_token_ns"] == pytest.approx(3000.0, rel=0.02)
    assert fitted["step_per_kv_token_ns"] == 0.0
    _assert_predicts(fitted, measured)
