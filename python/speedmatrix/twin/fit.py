"""Fit the engine's parameters to measured cells, with uncertainties.

Decode step: each cell gives two measures of one step time, its median per-token gap (time
between tokens) and its mean step (``batch × 1000 / total tok/s``). Least squares on the
relative error of ``step = a + b n + c n² + d kv + g [n ≥ 2] + e kv / n`` (the model of
:mod:`speedmatrix.twin.model`; ``d`` or ``e``, whichever fits closer),
``n`` the batch and ``kv`` the tokens it attends. From a run's raw records both come measured
(`speedmatrix.twin.samples`); from figures alone (`fit_step`) ``n = min(N, max_running)`` and
``kv`` is the batch times the context plus half the window's generated tokens. Each parameter's
standard deviation comes from the fit's covariance (residual variance × (XᵀX)⁻¹); a negative
term is dropped and the rest refitted (`_solve_terms`), so the step never falls with load.

Cold prefill: ``ttft = f + p C + q C(C-1)/2`` (front-end overhead, per-token and per-token-pair
prefill cost) by least squares on the relative error over the alone warm-up requests; with
prompts of two lengths only ``q`` is 0, with one only ``p`` is fitted (``f`` = 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speedmatrix.twin.model import STEP_KEYS, ProfileError, attended_tokens, step_row
from speedmatrix.twin.samples import PrefillSample, StepSample

__all__ = ["MeasuredCell", "PrefillFit", "StepFit", "fit_prefill", "fit_step", "fit_steps"]


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
    #: a cell's key ((context, concurrency) or its id) -> relative residual of its time between
    #: tokens (model / measured - 1)
    residuals: dict[Any, float] = field(default_factory=dict)
    #: the step parameters' covariance (STEP_KEYS order) and the relative scatter of the
    #: measured steps about the fitted ones
    cov: list[list[float]] = field(default_factory=list)
    scatter: float = 0.0


@dataclass
class PrefillFit:
    params: dict[str, float]
    sd: dict[str, float]
    #: prompt tokens -> relative residual of the median cold TTFT at that length
    residuals: dict[int, float] = field(default_factory=dict)


def _solve_cov(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Least-squares coefficients, their covariance and the residuals' standard deviation
    (the rows are relative errors: a share)."""
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = max(1, len(y) - x.shape[1])
    var = float(np.sum((x @ coef - y) ** 2)) / dof
    return coef, var * np.linalg.pinv(x.T @ x), float(np.sqrt(var))


def _solve(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    coef, cov, _ = _solve_cov(x, y)
    return coef, np.sqrt(np.clip(np.diag(cov), 0.0, None))


def _solve_terms(
    x: np.ndarray, y: np.ndarray, terms: list[int]
) -> tuple[np.ndarray, np.ndarray, float]:
    """`_solve_cov` over the columns ``terms`` with every coefficient at least 0 (a step's
    cost never falls as the batch or the cache grows; a negative term fitted to noisy cells
    predicts negative steps): the most negative term is dropped and the rest refitted until
    none is; a term left out is 0 with no variance."""
    keep = list(terms)
    while True:
        part, part_cov, scatter = _solve_cov(x[:, keep], y)
        if len(keep) == 1 or part.min() >= 0:
            break
        del keep[int(np.argmin(part))]
    coef, cov = np.zeros(x.shape[1]), np.zeros((x.shape[1], x.shape[1]))
    coef[keep] = np.clip(part, 0.0, None)
    cov[np.ix_(keep, keep)] = part_cov
    return coef, cov, scatter


def _step_terms(batches: set[int]) -> list[list[int]]:
    """The candidate term sets (`STEP_KEYS` indices) the batch sizes measured can pin: the
    base and per-sequence terms always, and one context term, per sequence (the KV each
    sequence attends: a paged-attention GPU server) or per step (the batch's mean context:
    llama.cpp on a CPU), both tried; each further batch size pins one more batch term, the
    square (a step convex in the batch) or the batched surcharge (a faster one-sequence
    path; only with a batch of 1 measured). With room for one of the two, both are tried."""
    extra = [2, 4] if 1 in batches else [2]
    room = len(batches) - 2
    out = []
    for context_term in (3, 5):
        base = [0, 1, context_term]
        if room <= 0:
            out.append(base)
        elif room >= len(extra):
            out.append(sorted(base + extra))
        else:
            out += [sorted([*base, term]) for term in extra]
    return out


def fit_steps(base: Mapping[str, Any], samples: Sequence[StepSample]) -> StepFit:
    """The decode-step parameters of ``base`` (its pool and limits kept) fitted to the step
    samples of a run's records; at least three cells of two batch sizes are needed."""
    cells = [s for s in samples if s.tbt_ms > 0 and s.mean_step_ms > 0 and s.batch > 0]
    if len(cells) < 3 or len({round(s.batch) for s in cells}) < 2:
        raise ProfileError("fitting the decode step needs 3 valid cells at 2 concurrency levels")
    rows, y = [], []
    for s in cells:
        for target in (s.tbt_ms, s.mean_step_ms):
            rows.append(step_row(s.batch, s.kv_tokens) / target)
            y.append(1.0)
    x = np.array(rows)
    coef, cov, scatter = min(
        (
            _solve_terms(x, np.array(y), terms)
            for terms in _step_terms({round(s.batch) for s in cells})
        ),
        key=lambda fitted: fitted[2],
    )
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    profile = dict(base)
    profile.update({k: float(v) for k, v in zip(STEP_KEYS, coef, strict=True)})
    fit = StepFit(profile, {k: float(v) for k, v in zip(STEP_KEYS, sd, strict=True)})
    fit.cov = cov.tolist()
    fit.scatter = scatter
    for s in cells:
        model = float(step_row(s.batch, s.kv_tokens) @ coef)
        fit.residuals[s.cell_id] = model / s.tbt_ms - 1
    return fit


def fit_step(
    base: Mapping[str, Any],
    measured: Iterable[MeasuredCell],
    window_s: float = 30.0,
    max_output: int = 1 << 30,
) -> StepFit:
    """`fit_steps` from cells' figures alone (no records): ``batch = min(N, max_running)``,
    each request attending its context plus half the window's generated tokens (half its
    output when it finishes sooner: `attended_tokens`)."""
    max_running = int(base.get("max_running", 1 << 30))
    samples = []
    for c in measured:
        if c.total_tok_s <= 0 or c.tbt_ms <= 0:
            continue
        batch = min(c.concurrency, max_running)
        kv = batch * attended_tokens(c.context, c.tbt_ms, window_s, max_output)
        step = 1000.0 * batch / c.total_tok_s
        samples.append(
            StepSample(
                f"{c.context}x{c.concurrency}", c.context, c.concurrency, batch, kv, c.tbt_ms, step
            )
        )
    fit = fit_steps(base, samples)
    by_id = {s.cell_id: (s.context, s.concurrency) for s in samples}
    fit.residuals = {by_id[k]: v for k, v in fit.residuals.items()}
    return fit


def _prefill_row(tokens: float) -> np.ndarray:
    return np.array([1.0, tokens * 1e-3, tokens * (tokens - 1) / 2 * 1e-9])


def fit_prefill(samples: Sequence[PrefillSample]) -> PrefillFit:
    """``frontend_overhead_ms``, ``prefill_per_token_us`` and ``prefill_per_token_ctx_ns`` (the
    engine's front-end per-token cost folded into the prefill's: the TTFT of a prompt alone
    cannot tell them apart) from cold TTFTs, one median per prompt length."""
    by_len: dict[int, list[float]] = {}
    for s in samples:
        by_len.setdefault(s.prompt_tokens, []).append(s.ttft_ms)
    if not by_len:
        raise ProfileError("fitting the prefill needs a warm-up request alone on the server")
    lengths = sorted(by_len)
    ttft = np.array([float(np.median(by_len[n])) for n in lengths])
    full = np.array([_prefill_row(n) for n in lengths]) / ttft[:, None]
    keep = [0, 1, 2] if len(lengths) >= 3 else [0, 1] if len(lengths) == 2 else [1]
    coef, sd = np.zeros(3), np.zeros(3)
    coef[keep], sd[keep] = _solve(full[:, keep], np.ones(len(lengths)))
    if coef[2] < 0 and len(keep) == 3:
        coef, sd = np.zeros(3), np.zeros(3)
        coef[[0, 1]], sd[[0, 1]] = _solve(full[:, [0, 1]], np.ones(len(lengths)))
    if coef[0] < 0:
        coef[0], sd[0] = 0.0, 0.0
        idx = [i for i in keep if i != 0]
        coef[idx], sd[idx] = _solve(full[:, idx], np.ones(len(lengths)))
    keys = ("frontend_overhead_ms", "prefill_per_token_us", "prefill_per_token_ctx_ns")
    fit = PrefillFit(
        {k: float(v) for k, v in zip(keys, coef, strict=True)},
        {k: float(v) for k, v in zip(keys, sd, strict=True)},
    )
    model = np.array([_prefill_row(n) for n in lengths]) @ coef
    fit.residuals = {n: float(m / t - 1) for n, m, t in zip(lengths, model, ttft, strict=True)}
    return fit
