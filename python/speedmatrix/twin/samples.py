"""What a fit reads from a cell's raw records: decode-step samples and cold-prefill samples.

A decode cell gives one `StepSample`: over its window ``[t0, t1]``, the batch (the window
requests' streaming time inside the window, from the first arrival to one step after the last,
over its length: ``min(N, max_running)`` in a closed
loop, less while a request completes and its slot refills), the KV tokens the batch attends
(the batch times the mean, over the window's token arrivals, of the request's prompt plus the
tokens it had received by then), the median per-token gap (the cell's ``tbt_ms``) and the mean
step (``batch / (tokens in the window / window)``). Arrivals come from
`speedmatrix.records.token_arrivals` (the core's one derivation).

A cold prefill is a warm-up request (phase 0) that was alone on the server from its send to its
first token and whose prompt was not served from the prefix cache. The records do not say
whether it was: a request whose TTFT is under half the slowest alone TTFT of the same prompt
length is taken for a cache hit and left out (a hit skips the prefill: typically 5-10x faster).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from speedmatrix.records import Records

__all__ = ["PrefillSample", "StepSample", "prefill_samples", "step_sample"]

_OUTCOME_ERROR = 3  # Outcome::kError (records.hpp)
#: a cache hit is at least this much faster than a cold prefill of the same length
_CACHE_HIT_SHARE = 0.5


@dataclass(frozen=True)
class StepSample:
    """One decode cell's window, reduced to what the step model reads."""

    cell_id: str
    context: int
    concurrency: int
    batch: float
    kv_tokens: float
    tbt_ms: float  #: median per-token gap
    mean_step_ms: float  #: batch / output tok/s


@dataclass(frozen=True)
class PrefillSample:
    cell_id: str
    prompt_tokens: int
    ttft_ms: float
    sent_ns: int


def _window(rec: Records, cell: dict) -> tuple[int, int]:
    t0 = rec.window_start_ns if rec.window_start_ns > 0 else int(cell.get("t0_ns") or 0)
    t1 = rec.window_end_ns if rec.window_end_ns > 0 else int(cell.get("t1_ns") or 0)
    return t0, t1


def step_sample(cell: dict, rec: Records) -> StepSample | None:
    """The cell's step sample; None when its window has no two arrivals of one request."""
    t0, t1 = _window(rec, cell)
    a = rec.arrivals(1)
    if t1 <= t0 or len(a["t_ns"]) == 0:
        return None
    q = rec.requests
    failed = np.asarray(q["outcome"]) == _OUTCOME_ERROR
    req, t_ns, tokens = a["request"], a["t_ns"], a["tokens"].astype(np.int64)
    # tokens each request had received by each arrival (arrivals are ordered by request, time)
    cum = np.cumsum(tokens)
    first = np.r_[True, req[1:] != req[:-1]]
    start_cum = np.maximum.accumulate(np.where(first, cum - tokens, 0))
    received = cum - start_cum
    inside = (t_ns >= t0) & (t_ns <= t1) & ~failed[req]
    gaps = a["gap_ms"][inside]
    ok_gaps = np.isfinite(gaps)
    if not ok_gaps.any() or tokens[inside].sum() == 0:
        return None
    tbt = float(np.median(np.repeat(gaps[ok_gaps], tokens[inside][ok_gaps])))
    window_s = (t1 - t0) / 1e9
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(req)] - 1
    # a request streams until one step after its last arrival (the window's end cuts it)
    span = np.minimum(t_ns[ends] + tbt * 1e6, t1) - np.maximum(t_ns[starts], t0)
    batch = float(np.clip(span, 0, None)[~failed[req[starts]]].sum()) / (t1 - t0)
    if batch <= 0:
        return None
    per_request_kv = np.asarray(q["prompt_tokens"], dtype=float)[req[inside]] + received[inside]
    rate = tokens[inside].sum() / window_s
    return StepSample(
        cell_id=str(cell["id"]),
        context=int(cell["context"]),
        concurrency=int(cell["concurrency"]),
        batch=float(batch),
        kv_tokens=float(batch * np.average(per_request_kv, weights=tokens[inside])),
        tbt_ms=tbt,
        mean_step_ms=float(1000.0 * batch / rate),
    )


def _alone(sent: np.ndarray, first: np.ndarray, done: np.ndarray, i: int) -> bool:
    others = np.arange(len(sent)) != i
    overlap = (sent[others] < first[i]) & (done[others] > sent[i])
    return not overlap.any()


def prefill_samples(cells: Iterable[tuple[dict, Records]]) -> list[PrefillSample]:
    """Cold prefills of the warm-up requests of ``cells`` (one per send: a prefill cell measured
    during a decode warm-up shares that cell's records), cache hits left out."""
    seen: dict[int, PrefillSample] = {}
    for cell, rec in cells:
        q = rec.requests
        sent = np.asarray(q["sent_ns"], dtype=np.int64)
        first = np.asarray(q["first_token_ns"], dtype=np.int64)
        done = np.where(np.asarray(q["done_ns"]) > 0, q["done_ns"], np.iinfo(np.int64).max)
        ok = (np.asarray(q["outcome"]) != _OUTCOME_ERROR) & (first > sent) & (sent > 0)
        for i in np.flatnonzero(ok & (np.asarray(q["phase"]) == 0)):
            if int(sent[i]) in seen or not _alone(sent, first, done, int(i)):
                continue
            ttft_ms = (int(first[i]) - int(sent[i])) / 1e6
            seen[int(sent[i])] = PrefillSample(
                str(cell["id"]), int(q["prompt_tokens"][i]), ttft_ms, int(sent[i])
            )
    slowest: dict[int, float] = {}
    for s in seen.values():
        slowest[s.prompt_tokens] = max(slowest.get(s.prompt_tokens, 0.0), s.ttft_ms)
    return sorted(
        (s for s in seen.values() if s.ttft_ms >= _CACHE_HIT_SHARE * slowest[s.prompt_tokens]),
        key=lambda s: s.sent_ns,
    )
