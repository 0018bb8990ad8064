"""The built-in engine's steady state, evaluated from a profile without sending load.

Mirrors ``cpp/src/sim/engine.cpp``: a decode step of a batch of ``n`` requests attending
``kv`` tokens in all takes ``step_base_ms + step_per_seq_ms n + step_per_seq2_ms n² +
step_per_kv_token_ns kv + step_batched_ms [n ≥ 2] + step_per_ctx_token_ns kv / n``; a cold
prompt of ``C`` tokens takes the front-end's cost plus the prefill's (``C τ0 + τ1 C²/2``). A closed-loop decode cell of ``N`` streams at context ``C``
holds ``min(N, max_running)`` requests in the batch; each has ``C`` plus, on average, half
the window's generated tokens (half its output when it finishes within the window) in the
KV cache. A cell is over capacity when its running
requests could not all hold ``C + max_output`` tokens in the pool (the sweep's rule), queued
when ``N`` exceeds ``max_running``. Intervals: for a fitted profile (``fit.cov``, ``fit.scatter``: `speedmatrix fit`) the
step's prediction interval at the confidence level of every interval: the fitted mean's
variance ``r Cov rᵀ`` plus the fit's relative scatter; given ``sd`` (or a profile with
``fit.sd`` only), every step parameter at minus / plus its standard deviation (the step time
rises with each, so the two ends bound the figure).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from speedmatrix.capacity import CapacityModel
from speedmatrix.figures import Z_TWO_SIDED

STEP_KEYS = (
    "step_base_ms",
    "step_per_seq_ms",
    "step_per_seq2_ms",
    "step_per_kv_token_ns",
    "step_batched_ms",
    "step_per_ctx_token_ns",
)
OPTIONAL_STEP_KEYS = frozenset({"step_batched_ms", "step_per_ctx_token_ns"})
PREFILL_KEYS = ("prefill_per_token_us", "prefill_per_token_ctx_ns", "frontend_overhead_ms")
#: fixed-point iterations of the per-request rate (the KV attended depends on it); 8 settle
#: every seed cell to under 0.01 %
_ITERATIONS = 8


class ProfileError(ValueError):
    """A profile that lacks a number the model needs."""


@dataclass(frozen=True)
class PredictedCell:
    context: int
    concurrency: int
    status: str  # "valid", "queued" or "over_capacity"
    total_tok_s: float | None
    total_tok_s_low: float | None
    total_tok_s_high: float | None
    tbt_ms: float | None
    tbt_ms_low: float | None
    tbt_ms_high: float | None
    predicted: bool = True
    #: the most forward passes one decode step may take (`slot_passes`): above 1, the
    #: interval spans one pass to that many
    slot_passes: int = 1


def _need(profile: Mapping[str, Any], key: str) -> float:
    if key not in profile:
        raise ProfileError(f"profile lacks {key!r}, which the engine model needs")
    return float(profile[key])


def step_row(batch: float, kv_tokens: float) -> np.ndarray:
    """The step model's terms in `STEP_KEYS` order (a step = row · coefficients). The batched
    term is the share of steps with two or more sequences: 0 at a batch of 1, 1 from 2 up,
    between for a measured mean batch between them (a window that ran 1 and 2 in turn). The
    context term is the batch's mean context (``kv / batch``), paid once per step."""
    batched = min(1.0, max(0.0, batch - 1.0))
    mean_context = kv_tokens / batch if batch > 0 else 0.0
    return np.array([1.0, batch, batch * batch, kv_tokens * 1e-6, batched, mean_context * 1e-6])


def step_coefficients(profile: Mapping[str, Any]) -> np.ndarray:
    """A profile's step parameters in `STEP_KEYS` order; `OPTIONAL_STEP_KEYS` read 0 when
    absent (profiles and fits made before them)."""
    return np.array(
        [
            float(profile.get(k, 0.0)) if k in OPTIONAL_STEP_KEYS else _need(profile, k)
            for k in STEP_KEYS
        ]
    )


def step_ms(profile: Mapping[str, Any], batch: float, kv_tokens: float) -> float:
    """One decode step of ``batch`` requests attending ``kv_tokens`` in all (engine.cpp)."""
    return float(step_row(batch, kv_tokens) @ step_coefficients(profile))


def cold_ttft_ms(profile: Mapping[str, Any], context: int) -> float:
    """Time to first token of one prompt of ``context`` tokens on an idle engine."""
    chunks = -(-context // max(1, int(_need(profile, "chunk_tokens"))))
    prefill = context * (
        _need(profile, "prefill_per_token_us") * 1e-3
        + _need(profile, "prefill_per_token_ctx_ns") * (context - 1) / 2 / 1e9
    )
    return (
        _need(profile, "frontend_overhead_ms")
        + float(profile.get("frontend_per_token_us", 0.0)) * 1e-3 * context
        + prefill
        + chunks * float(profile.get("prefill_chunk_overhead_ms", 0.0))
    )


def status(profile: Mapping[str, Any], context: int, concurrency: int, max_output: int) -> str:
    """The sweep's capacity rule (`speedmatrix.capacity`) of the measured server's family (a
    shared pool unless the fit read another: ``fit.capacity``, e.g. llama.cpp's slots): ``over_capacity``
    when the running ``min(N, max_running)`` requests cannot all hold ``C + max_output`` tokens
    (whole blocks) in the KV pool or one does not fit its slot, ``queued`` when N exceeds the
    running limit, else ``valid``."""
    block = int(profile.get("block_size", 1) or 1)
    measured = (profile.get("fit") or {}).get("capacity") or {}
    slot = measured.get("slot_tokens")
    rule = CapacityModel(
        str(measured.get("family") or "shared_pool"),
        pool_tokens=int(_need(profile, "kv_tokens")),
        slot_tokens=int(slot) if slot else None,
        slots=int(_need(profile, "max_running")),
        block_tokens=block if block > 1 else None,
    )
    fit = rule.check(context, concurrency, max_output)
    if fit.status == "over_capacity":
        return "over_capacity"
    return "queued" if fit.queued else "valid"


def slot_passes(family: str | None, slots: int, concurrency: int) -> int:
    """The most forward passes one decode step may take with ``concurrency`` requests on
    ``slots`` slots (0: not known); above the slots, the slots run full. llama.cpp with split slot caches (capacity family ``per_slot``; also the family of
    a layout it does not state) splits a batch into micro-batches of consecutive slot ids
    only (llama-batch.cpp ``split_equal``: "accept only increasing sequence ids"), so ``b``
    busy slots of ``K`` with idle ones between them run in up to ``min(b, K - b + 1)``
    passes, by the slots the server gave them, which a client cannot see. A full or
    single-request batch, and every other family, takes one."""
    batch = min(concurrency, slots)
    if family != "per_slot" or batch < 2 or batch >= slots:
        return 1
    return min(batch, slots - batch + 1)


def profile_slot_passes(profile: Mapping[str, Any], batch: int) -> int:
    """`slot_passes` for a profile: the measured server's family (``fit.capacity``), its
    running limit as the slots."""
    measured = (profile.get("fit") or {}).get("capacity") or {}
    family = measured.get("family")
    return slot_passes(str(family) if family else None, int(profile.get("max_running") or 0), batch)


def attended_tokens(context: int, step: float, window_s: float, max_output: int) -> float:
    """The tokens one request attends on average: its prompt and half of what it generates
    while the window lasts, or half its output when it finishes sooner (a closed loop then
    starts the next request from its prompt)."""
    return context + min((1000.0 / step) * window_s, float(max_output)) / 2


def _decode_step_ms(
    profile: Mapping[str, Any], context: int, batch: int, window_s: float, max_output: int
) -> float:
    step = step_ms(profile, batch, batch * context)
    for _ in range(_ITERATIONS):
        step = step_ms(profile, batch, batch * attended_tokens(context, step, window_s, max_output))
    return step


def _split_step_ms(
    profile: Mapping[str, Any],
    context: int,
    batch: int,
    passes: int,
    window_s: float,
    max_output: int,
) -> float:
    """One decode step of ``batch`` requests run as ``passes`` forward passes: ``passes - 1``
    of one request and one of the rest (the most a split by slot gaps can take)."""
    sizes = [1] * (passes - 1) + [batch - passes + 1]
    step = sum(_decode_step_ms(profile, context, n, window_s, max_output) for n in sizes)
    for _ in range(_ITERATIONS):
        per_request = attended_tokens(context, step, window_s, max_output)
        step = sum(step_ms(profile, n, n * per_request) for n in sizes)
    return step


def _half_width_ms(fit: Mapping[str, Any], batch: float, kv: float, step: float) -> float:
    """Half the prediction interval of one step: the fitted mean's uncertainty
    (``r Cov rᵀ``, ``r`` the step model's row) and the fit's relative scatter about it, at
    the confidence level of every interval (`speedmatrix.figures.CONFIDENCE`)."""
    cov = np.asarray(fit["cov"], dtype=float)
    row = step_row(batch, kv)[: len(cov)]  # a fit made before the later terms has fewer rows
    var_mean = float(row @ cov @ row)
    scatter = float(fit.get("scatter", 0.0)) * step
    return Z_TWO_SIDED * math.sqrt(max(0.0, var_mean) + scatter * scatter)


def _shifted(profile: Mapping[str, Any], sd: Mapping[str, float], sign: float) -> dict[str, Any]:
    out = dict(profile)
    for key, value in zip(STEP_KEYS, step_coefficients(profile), strict=True):
        out[key] = max(0.0, float(value) + sign * float(sd.get(key, 0.0)))
    return out


def predict_cell(
    profile: Mapping[str, Any],
    context: int,
    concurrency: int,
    *,
    max_output: int = 4096,
    window_s: float = 30.0,
    sd: Mapping[str, float] | None = None,
) -> PredictedCell:
    """One closed-loop decode cell's predicted figures; ``sd``: each step parameter's
    standard deviation; by default a fitted profile's own (``fit.sd``, `speedmatrix fit`),
    none (a point interval) for a profile that was not fitted."""
    st = status(profile, context, concurrency, max_output)
    if st == "over_capacity":
        return PredictedCell(context, concurrency, st, None, None, None, None, None, None)
    batch = min(concurrency, int(_need(profile, "max_running")))
    fit = profile.get("fit") or {}
    if sd is None and fit.get("cov") is not None:
        mid_step = _decode_step_ms(profile, context, batch, window_s, max_output)
        kv = batch * attended_tokens(context, mid_step, window_s, max_output)
        half = _half_width_ms(fit, batch, kv, mid_step)
        low_step, high_step = max(1e-9, mid_step - half), mid_step + half
    else:
        sd = fit.get("sd") or {} if sd is None else sd
        low_step, mid_step, high_step = (
            _decode_step_ms(p, context, batch, window_s, max_output)
            for p in (_shifted(profile, sd, -1.0), profile, _shifted(profile, sd, 1.0))
        )
    passes = profile_slot_passes(profile, batch)
    if passes > 1:
        # one pass or several, by the slots the server gave; and a fit that left such
        # batches out (`speedmatrix.twin.fitrun`) knows a one-pass step of this size only to
        # lie between a step of one request and a step of every slot (it never falls as the
        # batch grows)
        slots = int(_need(profile, "max_running"))
        single = _decode_step_ms(profile, context, 1, window_s, max_output)
        full = _decode_step_ms(profile, context, slots, window_s, max_output)
        split = _split_step_ms(profile, context, batch, passes, window_s, max_output)
        low_step = min(low_step, single * low_step / mid_step)
        high_step = max(high_step, max(split, full) * high_step / mid_step)
    return PredictedCell(
        context,
        concurrency,
        st,
        slot_passes=passes,
        total_tok_s=batch * 1000.0 / mid_step,
        total_tok_s_low=batch * 1000.0 / high_step,
        total_tok_s_high=batch * 1000.0 / low_step,
        tbt_ms=mid_step,
        tbt_ms_low=low_step,
        tbt_ms_high=high_step,
    )


def predict_matrix(
    profile: Mapping[str, Any],
    contexts: Iterable[int],
    concurrency: Iterable[int],
    **kwargs: Any,
) -> list[PredictedCell]:
    """Every (context, concurrency) decode cell, contexts outer, in the order given."""
    levels = list(concurrency)
    return [predict_cell(profile, c, n, **kwargs) for c in contexts for n in levels]
