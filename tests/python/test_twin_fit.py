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
