"""Latency distributions of one cell, derived from its raw records.

Pure functions over the record columns of ``_core`` (``requests`` and ``events`` dicts of
numpy arrays, as a cell returns them and as ``records/<id>.npz`` keeps them). Every figure
here comes from one function, so the live sweep and a saved run give the same numbers.

Per request (window requests only, ``phase == 1``):

- ``e2e_ms``: ``done − sent``; ``ttft_ms``: ``first_token − sent``;
- ``tpot_ms``: ``(e2e − ttft) / (output_tokens − 1)`` (requests with at least 2 tokens);
- ``tbt_ms``: not per request: the cell's one TBT sample set, the gaps between the window's
  token arrivals (``_core.token_arrivals``; a read's gap spread over its tokens, each token
  one sample) of window requests that did not fail, whose median is the cell's ``tbt_ms``;
- open loop only: ``e2e_sched_ms`` and ``ttft_sched_ms`` from the *scheduled* time (what a
  user who arrived then waits; wrk2's corrected view) beside the same from the actual send,
  and ``queue_ms = sent − scheduled`` (time at the client's gate plus send lateness).

Which requests count: in an open-loop cell, every window arrival that completed OK (the
drain lets them finish after ``t0 + D``); in a closed-loop cell, the requests that finished
OK inside ``[t0, t1]``, whenever they were sent: the steady-state window opens only once
every slot streams, so the first wave was sent before it, and with long outputs few
requests are sent inside it at all (the ones cancelled at the window's end have no
end-to-end latency).

Each distribution gives n, mean with a 95% t-interval (the core's t quantile, `figures`),
and the asked percentiles (linear interpolation) each with a 95% distribution-free interval
from order statistics (the binomial rule, normal approximation), both from the core
(`_core.quantiles`, the rule of every median interval); an interval whose ranks fall outside
the sample is NaN on that side. The TBT distribution has no intervals of its own: the one
interval of the median TBT is the core's (``ci.tbt_ms``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from speedmatrix import figures
from speedmatrix._native import _core
from speedmatrix.figures import DEFAULT_PERCENTILES, tbt_levels
from speedmatrix.verdict import openloop

__all__ = [
    "DEFAULT_PERCENTILES",
    "OUTCOME_CANCELLED",
    "OUTCOME_ERROR",
    "OUTCOME_OK",
    "cell_latency",
    "coalesced_share",
    "distribution",
    "open_loop_figures",
    "parse_percentiles",
    "per_request",
    "percentile_key",
    "request_tokens",
]

OUTCOME_OK, OUTCOME_CANCELLED, OUTCOME_ERROR = 1, 2, 3


def parse_percentiles(text: str | list | tuple) -> tuple[float, ...]:
    """``"50,90,99.9"`` (or a sequence) -> sorted unique floats in (0, 100).

    Raises ValueError naming the offending item."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: set[float] = set()
    for item in items:
        s = str(item).strip().rstrip("%")
        if not s:
            continue
        try:
            p = float(s.lower().lstrip("p"))
        except ValueError:
            raise ValueError(f"not a percentile: {item!r} (expected e.g. 50,90,99.9)") from None
        if not (0 < p < 100):
            raise ValueError(f"percentile {item!r} is not between 0 and 100")
        out.add(p)
    if not out:
        raise ValueError("no percentiles given")
    return tuple(sorted(out))


def percentile_key(p: float) -> str:
    """``50 -> "p50"``, ``99.9 -> "p99.9"``: the names percentiles carry in run.json."""
    return f"p{p:g}"


def distribution(values: Any, percentiles: tuple[float, ...] = DEFAULT_PERCENTILES) -> dict:
    """Summary of one sample: ``{"n", "mean", "mean_ci", "median", "median_ci",
    "p50": v, ..., "ci": {"p50": [lo, hi], ...}}``; NaN figures for an empty sample."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]  # a copy, sorted in place: one sample per token may be many
    v.sort()
    return _sorted_distribution(v, percentiles)


def _sorted_distribution(v: np.ndarray, percentiles: tuple[float, ...]) -> dict:
    """`distribution` of ``v``, finite and sorted already (read, not copied)."""
    n = len(v)
    out: dict[str, Any] = {"n": n}
    if n == 0:
        out.update(mean=math.nan, mean_ci=[math.nan, math.nan], median=math.nan)
        out["median_ci"] = [math.nan, math.nan]
        for p in percentiles:
            out[percentile_key(p)] = math.nan
        out["ci"] = {percentile_key(p): [math.nan, math.nan] for p in percentiles}
        return out
    mean = float(v.mean())
    if n >= 2:
        half = figures.t_quantile(n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
        mean_ci = [mean - half, mean + half]
    else:
        mean_ci = [math.nan, math.nan]
    ci = {}
    # the core owns percentiles and their order-statistic intervals (`_core.quantiles`)
    ps = sorted({50.0, *percentiles})
    for p, (value, lo, hi) in zip(ps, _core.quantiles(v, [p / 100 for p in ps])):
        out[percentile_key(p)] = float(value)
        ci[percentile_key(p)] = [float(lo), float(hi)]
    # the median is the p50 (one computation); run.json keeps both keys
    out.update(mean=mean, mean_ci=mean_ci, median=out["p50"], median_ci=ci["p50"])
    if 50.0 not in percentiles:
        del out["p50"], ci["p50"]
    out["ci"] = ci
    return out


def _col(d: dict, name: str) -> np.ndarray:
    return np.asarray(d[name])


def _core_requests(requests: dict) -> dict:
    """``requests`` as the core reads them: records built by hand may lack ``prompt_tokens``,
    which no per-token figure reads (zeros stand in)."""
    if "prompt_tokens" in requests:
        return requests
    return {**requests, "prompt_tokens": np.zeros(len(requests["sent_ns"]), np.int64)}


def request_tokens(requests: dict, events: dict, t0_ns: int, t1_ns: int) -> dict[str, np.ndarray]:
    """Per request, what its token arrivals add up to (`_core.request_tokens`: ``tokens``,
    ``window_tokens`` in [t0_ns, t1_ns], ``first_ns``, ``last_ns``, ``max_gap_ms``); O(requests)
    memory, no per-token array."""
    rt = _core.request_tokens(_core_requests(requests), events, int(t0_ns), int(t1_ns))
    return {k: np.asarray(v) for k, v in rt.items()}


def per_request(requests: dict, events: dict | None = None) -> dict[str, np.ndarray]:
    """Per-request latencies in ms (NaN where undefined) for every record, aligned with the
    records: e2e_ms, ttft_ms, tpot_ms, e2e_sched_ms, ttft_sched_ms, queue_ms, and from
    ``events`` tbt_max_ms (the request's longest gap between token arrivals) and
    tpot_so_far_ms (first to last token received over the tokens between: the pace of a
    request cut before its end), both from `_core.request_tokens`."""
    sched = _col(requests, "scheduled_ns").astype(np.int64)
    sent = _col(requests, "sent_ns").astype(np.int64)
    first = _col(requests, "first_token_ns").astype(np.int64)
    done = _col(requests, "done_ns").astype(np.int64)
    out_tok = _col(requests, "output_tokens").astype(float)

    def diff_ms(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ok = (a >= 0) & (b >= 0)
        return np.where(ok, (a - b) / 1e6, np.nan)

    e2e = diff_ms(done, sent)
    ttft = diff_ms(first, sent)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tok >= 2, (e2e - ttft) / (out_tok - 1), np.nan)
    n = len(sent)
    tbt_max = np.full(n, np.nan)
    tpot_so_far = np.full(n, np.nan)
    if events and len(events.get("t_ns", ())) and n:
        rt = request_tokens(requests, events, 0, 0)
        tbt_max = np.asarray(rt["max_gap_ms"], dtype=float)
        seen = np.asarray(rt["tokens"]).astype(float)
        last = np.asarray(rt["last_ns"], dtype=np.int64)
        # A request cut before its end: its pace so far, from its first to its last token.
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot_so_far = np.where(
                (seen >= 2) & (first >= 0), (last - first) / 1e6 / (seen - 1), np.nan
            )
    return {
        "tpot_so_far_ms": tpot_so_far,
        "e2e_ms": e2e,
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "e2e_sched_ms": diff_ms(done, sched),
        "ttft_sched_ms": diff_ms(first, sched),
        "queue_ms": diff_ms(sent, sched),
        "tbt_max_ms": tbt_max,
    }


def coalesced_share(requests: dict, events: dict | None, t0_ns: int, t1_ns: int) -> float:
    """The share of the window's token events that came in a socket read with another event
    (`_core.coalesced_share`; the catalogue's ``coalesced_share``); NaN without events."""
    if not events or not len(events.get("t_ns", ())):
        return math.nan
    return float(_core.coalesced_share(_core_requests(requests), events, int(t0_ns), int(t1_ns)))


def counted_mask(requests: dict, t0_ns: int, t1_ns: int, open_loop: bool) -> np.ndarray:
    """The window requests whose latencies count (see the module's rule), all outcomes:
    open loop, every arrival scheduled in [t0, t1); closed loop, every request sent by t1
    that ended inside [t0, t1] (a failure: at t0 or later) and was not cancelled."""
    phase = _col(requests, "phase")
    outcome = _col(requests, "outcome")
    if open_loop:
        s = _col(requests, "scheduled_ns")
        return (phase == 1) & (s >= t0_ns) & (s < t1_ns)
    sent = _col(requests, "sent_ns")
    done = _col(requests, "done_ns")
    return (
        (phase == 1)
        & (sent >= 0)
        & (sent <= t1_ns)
        & (outcome != OUTCOME_CANCELLED)
        & (done >= t0_ns)
        & ((done <= t1_ns) | (outcome == OUTCOME_ERROR))
    )


def cell_latency(
    requests: dict,
    events: dict | None,
    t0_ns: int,
    t1_ns: int,
    *,
    open_loop: bool = False,
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
    core: dict | None = None,
) -> dict:
    """The latency distributions of one cell: ``{"e2e_ms", "ttft_ms", "tpot_ms", "tbt_ms"}``
    (each a :func:`distribution`), and for an open-loop cell also ``e2e_sched_ms``,
    ``ttft_sched_ms`` and ``queue_ms``. Only requests that completed OK count. ``core``: the
    cell's `_core.summarize_cell` over [t0_ns, t1_ns] already made with
    ``tbt_qs=figures.tbt_levels(percentiles)`` (the verdict's), read instead of summarizing again."""
    lat = per_request(requests, events)
    ok = counted_mask(requests, t0_ns, t1_ns, open_loop) & (_col(requests, "outcome") == OUTCOME_OK)
    names = ["e2e_ms", "ttft_ms", "tpot_ms"]
    if open_loop:
        names += ["e2e_sched_ms", "ttft_sched_ms", "queue_ms"]
    out = {name: distribution(lat[name][ok], percentiles) for name in names}
    out["tbt_ms"] = _tbt_distribution(requests, events, t0_ns, t1_ns, percentiles, core)
    return out


def _tbt_distribution(
    requests: dict,
    events: dict | None,
    t0_ns: int,
    t1_ns: int,
    percentiles: tuple[float, ...],
    core: dict | None = None,
) -> dict:
    """The TBT distribution: the core's sample set (`_core.summarize_cell`'s tbt_count,
    tbt_mean_ms, tbt_quantiles_ms: the multiset whose median is the cell's tbt_ms), read, not
    derived here; no per-token array is held. Its samples are a stream's successive gaps (a
    read's tokens share one), not independent draws: the one interval of tbt_ms is the core's
    (run.json ci.tbt_ms, over per-second bins); none is written here."""
    ps = sorted({50.0, *percentiles})
    nan2 = [math.nan, math.nan]
    if core is not None:
        n_tbt, mean, values = int(core["tbt_count"]), core["tbt_mean_ms"], core["tbt_quantiles_ms"]
        if len(values) != len(ps):
            raise ValueError("the core's figures were made for other percentiles (tbt_levels)")
    elif events and len(events.get("t_ns", ())) and t1_ns > t0_ns:
        fig = _core.summarize_cell(
            _core_requests(requests), events, int(t0_ns), int(t1_ns), 1.0, -1, -1, tbt_levels(ps)
        )
        n_tbt, mean, values = int(fig["tbt_count"]), fig["tbt_mean_ms"], fig["tbt_quantiles_ms"]
    else:
        n_tbt, mean, values = 0, math.nan, [math.nan] * len(ps)
    tbt: dict[str, Any] = {"n": n_tbt}
    for p, v in zip(ps, values):
        tbt[percentile_key(p)] = float(v)
    tbt.update(mean=float(mean), mean_ci=nan2, median=tbt["p50"], median_ci=nan2)
    if 50.0 not in percentiles:
        del tbt["p50"]
    tbt["ci"] = {percentile_key(p): nan2 for p in percentiles}
    return tbt


def _in_flight_series(sent: np.ndarray, done: np.ndarray, t0: int, t1: int, bin_s: float):
    edges = np.arange(t0, t1 + 1, int(bin_s * 1e9), dtype=np.int64)
    s = np.sort(sent[sent >= 0])
    d = np.sort(np.where(done >= 0, done, np.iinfo(np.int64).max)[sent >= 0])
    # In flight at instant t: sent at or before t and not yet done.
    return (
        np.searchsorted(s, edges, side="right") - np.searchsorted(d, edges, side="right")
    ).astype(int)


def open_loop_figures(
    requests: dict,
    t0_ns: int,
    t1_ns: int,
    rate_per_s: float,
    *,
    bin_s: float = 1.0,
    growth_ratio: float = openloop.GROWTH_RATIO,
) -> dict:
    """What an open-loop cell did against what was asked.

    - ``arrivals``: window arrivals (scheduled in [t0, t1)); ``offered_rate_per_s`` =
      arrivals / D; ``achieved_rate_per_s`` = window requests actually sent in [t0, t1) / D;
      ``interarrival_cv``: coefficient of variation of the gaps between scheduled times;
    - ``completed`` / ``failed`` (errors) / ``cancelled`` (cut at the drain bound or never
      sent: ``unsent``); ``completed_rate_per_s`` = completed / D;
    - ``in_flight``: requests in flight at t0, t0 + bin, ... (a list), and its max;
    - ``queue_p99_ms``: p99 of sent − scheduled (the client's gate and send lateness);
    - ``kept_up`` and ``reason``: the verdict's rule (`speedmatrix.verdict.openloop.kept_up`)
      on these arrivals: none unfinished at the drain bound, and no latency from the
      scheduled time that grew ``growth_ratio`` times from the first quarter to the last.
    """
    phase = _col(requests, "phase")
    sched = _col(requests, "scheduled_ns").astype(np.int64)
    sent = _col(requests, "sent_ns").astype(np.int64)
    done = _col(requests, "done_ns").astype(np.int64)
    outcome = _col(requests, "outcome")
    win = (phase == 1) & (sched >= t0_ns) & (sched < t1_ns)
    d_s = max((t1_ns - t0_ns) / 1e9, 1e-9)
    n = int(win.sum())
    ws, wsent, wdone, wout = sched[win], sent[win], done[win], outcome[win]
    order = np.argsort(ws, kind="stable")
    ws, wsent, wdone, wout = ws[order], wsent[order], wdone[order], wout[order]
    gaps = np.diff(ws) / 1e9
    cv = float(gaps.std(ddof=1) / gaps.mean()) if len(gaps) >= 2 and gaps.mean() > 0 else math.nan
    sent_in = int(((wsent >= t0_ns) & (wsent < t1_ns)).sum())
    completed = int((wout == OUTCOME_OK).sum())
    failed = int((wout == OUTCOME_ERROR).sum())
    cancelled = int((wout == OUTCOME_CANCELLED).sum())
    unsent = int((wsent < 0).sum())
    series = _in_flight_series(wsent, wdone, t0_ns, t1_ns, bin_s)
    q = (wsent - ws)[wsent >= 0] / 1e6
    e2e_sched = np.where((wout == OUTCOME_OK) & (wdone >= 0), (wdone - ws) / 1e6, np.nan)
    kept_up, reason = openloop.kept_up(e2e_sched, cancelled, unsent, growth_ratio)
    return {
        "rate_per_s": float(rate_per_s),
        "arrivals": n,
        "offered_rate_per_s": n / d_s,
        "achieved_rate_per_s": sent_in / d_s,
        "interarrival_cv": cv,
        "completed": completed,
        "failed": failed,
        "cancelled": cancelled,
        "unsent": unsent,
        "completed_rate_per_s": completed / d_s,
        "in_flight": [int(x) for x in series],
        "in_flight_max": int(series.max()) if len(series) else 0,
        "queue_p99_ms": float(np.percentile(q, 99)) if len(q) else math.nan,
        "kept_up": kept_up,
        "reason": reason,
    }
