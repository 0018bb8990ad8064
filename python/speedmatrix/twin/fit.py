"""Fit the engine's decode-step parameters to measured decode cells, with uncertainties.

Each cell gives two measures of one step time: its time between tokens and ``batch × 1000 /
total tok/s``. Least squares on the relative error of ``step = a + b n + c n² + d kv`` (the model
of :mod:`speedmatrix.twin.model`), ``kv`` the tokens the batch attends (its context plus half
the window's generated tokens per request). Each parameter's standard deviation comes from the
fit's covariance (residual variance × (XᵀX)⁻¹); a negative square term is dropped and the rest
refitted, so the curve stays convex.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speedmatrix.twin.model import STEP_KEYS, ProfileError


@dataclass(frozen=True)
class MeasuredCell:
    context: int
    concurrency: int
    total_tok_s: float
    tbt_ms: float


@dataclass
class StepFit:
    profile: dict[str, Any]
    sd: dict[str, float]
    #: (context, concurrency) -> relative residual of the time between tokens (model / measured - 1)
    residuals: dict[tuple[int, int], float] = field(default_factory=dict)


def _rows(
    cells: list[MeasuredCell], max_running: int, window_s: float
) -> tuple[np.ndarray, np.ndarray]:
    rows = []
    for c in cells:
        batch = min(c.concurrency, max_running)
        kv = batch * (c.context + (1000.0 / c.tbt_ms) * window_s / 2)
        for target in (c.tbt_ms, 1000.0 * batch / c.total_tok_s):
            rows.append(np.array([1.0, batch, batch * batch, kv * 1e-6]) / target)
    x = np.array(rows)
    return x, np.ones(len(rows))


def _solve(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = max(1, len(y) - x.shape[1])
    var = float(np.sum((x @ coef - y) ** 2)) / dof
    cov = var * np.linalg.pinv(x.T @ x)
    return coef, np.sqrt(np.clip(np.diag(cov), 0.0, None))


def fit_step(
    base: Mapping[str, Any], measured: Iterable[MeasuredCell], window_s: float = 30.0
) -> StepFit:
    """The decode-step parameters of ``base`` (a profile: its pool and limits kept) refitted to
    ``measured`` valid decode cells; at least three cells of two batch sizes are needed."""
    cells = [c for c in measured if c.total_tok_s > 0 and c.tbt_ms > 0]
    if len(cells) < 3 or len({c.concurrency for c in cells}) < 2:
        raise ProfileError("fitting the decode step needs 3 valid cells at 2 concurrency levels")
    max_running = int(base.get("max_running", 1 << 30))
    x, y = _rows(cells, max_running, window_s)
    coef, sd = _solve(x, y)
    keys = list(STEP_KEYS)
    if coef[2] < 0:
        keep = [0, 1, 3]
        coef3, sd3 = _solve(x[:, keep], y)
        coef, sd = np.zeros(4), np.zeros(4)
        coef[keep], sd[keep] = coef3, sd3
    profile = dict(base)
    profile.update({k: float(v) for k, v in zip(keys, coef, strict=True)})
    fit = StepFit(profile, {k: float(s) for k, s in zip(keys, sd, strict=True)})
    for c in cells:
        batch = min(c.concurrency, max_running)
        kv = batch * (c.context + (1000.0 / c.tbt_ms) * window_s / 2)
        model = coef[0] + coef[1] * batch + coef[2] * batch * batch + coef[3] * kv * 1e-6
        fit.residuals[(c.context, c.concurrency)] = float(model / c.tbt_ms - 1)
    return fit
