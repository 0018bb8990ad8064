"""The core's TBT summary (`_core.summarize_cell`'s tbt_count, tbt_mean_ms,
tbt_quantiles_ms) and per-request reduction (`_core.request_tokens`) equal
what Python derived from the per-token arrays, for events in the transport's order
(streamed) and in any other order (sorted copy)."""

from __future__ import annotations

import numpy as np
import pytest
from speedmatrix import latency
from speedmatrix._native import _core
from speedmatrix.records import tbt_samples

QS = [0.5, 0.9, 0.95, 0.99, 0.999]
T0, T1 = 200_000_000, 900_000_000


def _records(n: int = 40, seed: int = 1) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n):
        t = int(rng.integers(0, 10**8))
        for _ in range(30):
            t += int(rng.integers(2 * 10**5, 5 * 10**7))
            rows.append((t, q, int(rng.integers(1, 4))))
    rows.sort()
    ev = {
        "t_ns": np.array([x[0] for x in rows], np.int64),
        "request": np.array([x[1] for x in rows], np.int32),
        "tokens": np.array([x[2] for x in rows], np.int32),
    }
    req = {
        "scheduled_ns": np.zeros(n, np.int64),
        "sent_ns": np.zeros(n, np.int64),
        "first_token_ns": np.ones(n, np.int64),
        "done_ns": np.full(n, 2 * 10**9, np.int64),
        "outcome": np.ones(n, np.uint8),
        "phase": np.ones(n, np.uint8),
        "prompt_tokens": np.zeros(n, np.int64),
        "output_tokens": np.full(n, 50, np.int64),
    }
    req["outcome"][3] = latency.OUTCOME_ERROR
    return req, ev


@pytest.mark.parametrize("order", ["transport", "reversed"])
def test_tbt_summary_is_the_sample_sets(order: str) -> None:
    req, ev = _records()
    if order == "reversed":
        ev = {k: v[::-1].copy() for k, v in ev.items()}
    f = _core.summarize_cell(req, ev, T0, T1, 1.0, -1, -1, QS)
    s = np.sort(tbt_samples(req, ev, T0, T1))
    assert f["tbt_count"] == len(s) > 100
    assert f["tbt_quantiles_ms"] == [v for v, _, _ in _core.quantiles(s, QS)]
    assert f["tbt_mean_ms"] == pytest.approx(float(s.mean()), rel=1e-12)


@pytest.mark.parametrize("order", ["transport", "reversed"])
def test_request_tokens_is_the_arrivals_reduced(order: str) -> None:
    req, ev = _records(seed=2)
    if order == "reversed":
        ev = {k: v[::-1].copy() for k, v in ev.items()}
    n = len(req["sent_ns"])
    rt = _core.request_tokens(req, ev, T0, T1)
    a = _core.token_arrivals(req, ev, -1)
    assert np.array_equal(rt["tokens"], np.bincount(a["request"], weights=a["tokens"], minlength=n))
    inside = (a["t_ns"] >= T0) & (a["t_ns"] <= T1)
    win = np.bincount(a["request"][inside], weights=a["tokens"][inside], minlength=n)
    assert np.array_equal(rt["window_tokens"], win)
    # the longest silence before an arrival (its gap times its tokens), from the arrivals
    silence = a["gap_ms"] * a["tokens"]
    has_gap = np.isfinite(silence)
    max_gap = np.full(n, np.nan)
    for q in range(n):
        mine = has_gap & (a["request"] == q)
        if mine.any():
            max_gap[q] = silence[mine].max()
    assert np.isfinite(max_gap).sum() == n  # every request has gaps: the check is not vacuous
    assert np.array_equal(rt["max_gap_ms"], max_gap)
    first = np.array([a["t_ns"][a["request"] == q].min() for q in range(n)])
    last = np.array([a["t_ns"][a["request"] == q].max() for q in range(n)])
    assert np.array_equal(rt["first_ns"], first) and np.array_equal(rt["last_ns"], last)


def test_tbt_summary_empty_window() -> None:
    req, ev = _records()
    f = _core.summarize_cell(req, ev, 10, 20, 1.0, -1, -1, QS)
    assert f["tbt_count"] == 0
    assert np.isnan(f["tbt_mean_ms"]) and all(np.isnan(f["tbt_quantiles_ms"]))
    with pytest.raises(ValueError, match="tbt_qs"):
        _core.summarize_cell(req, ev, T0, T1, 1.0, -1, -1, [1.5])
