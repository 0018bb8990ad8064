"""Latency distributions of one cell, derived from its raw records.

Pure functions over the record columns of ``_core`` (``requests`` and ``events`` dicts of
numpy arrays, as a cell returns them and as ``records/<id>.npz`` keeps them). Every figure
here comes from one function, so the live sweep and a saved run give the same numbers.

Per request (window requests only, ``phase == 1``):

- ``e2e_ms``: ``done − sent``; ``ttft_ms``: ``first_token − sent``;
- ``tpot_ms``: ``(e2e − ttft) / (output_tokens − 1)`` (requests with at least 2 tokens);
- ``tbt_ms``: the gaps between a request's token arrivals, a chunk's gap spread over its
  tokens (each token one sample), pooled over the cell's requests;
- open loop only: ``e2e_sched_ms`` and ``ttft_sched_ms`` from the *scheduled* time (what a
  user who arrived then waits; wrk2's corrected view) beside the same from the actual send,
  and ``queue_ms = sent − scheduled`` (time at the client's gate plus send lateness).

Which requests count: in an open-loop cell, every window arrival that completed OK (the
drain lets them finish after ``t0 + D``); in a closed-loop cell, the requests that finished
OK inside ``[t0, t1]``, whenever they were sent: the steady-state window opens only once
every slot streams, so the first wave was sent before it, and with long outputs few
requests are sent inside it at all (the ones cancelled at the window's end have no
end-to-end latency).

Each distribution gives n, mean with a 95% t-interval, and the asked percentiles (linear
interpolation, numpy's default) each with a 95% distribution-free interval from order
statistics (the binomial rule, normal approximation); an interval whose ranks fall outside
the sample is NaN on that side.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_PERCENTILES",
    "OUTCOME_CANCELLED",
    "OUTCOME_ERROR",
    "OUTCOME_OK",
    "cell_latency",
    "distribution",
    "open_loop_figures",
    "parse_percentiles",
    "per_request",
    "percentile_key",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
OUTCOME_OK, OUTCOME_CANCELLED, OUTCOME_ERROR = 1, 2, 3
_Z95 = 1.959963984540054


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


def _t95(df: int) -> float:
    # Student's t two-sided 95% quantile; the normal one with a Cornish-Fisher
    # correction (error < 1e-3 for df >= 3, the table below for small df).
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}
    if df in table:
        return table[df]
    z = _Z95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _quantile_ci(sorted_v: np.ndarray, q: float) -> list[float]:
    n = len(sorted_v)
    half = _Z95 * math.sqrt(n * q * (1 - q))
    lo_rank = math.floor(n * q - half)  # 1-based ranks of the order statistics
    hi_rank = math.ceil(n * q + half) + 1
    lo = float(sorted_v[lo_rank - 1]) if 1 <= lo_rank <= n else math.nan
    hi = float(sorted_v[hi_rank - 1]) if 1 <= hi_rank <= n else math.nan
    return [lo, hi]


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
        half = _t95(n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
        mean_ci = [mean - half, mean + half]
    else:
        mean_ci = [math.nan, math.nan]
    out.update(mean=mean, mean_ci=mean_ci, median=float(np.percentile(v, 50)))
    out["median_ci"] = _quantile_ci(v, 0.5)
    ci = {}
    for p in percentiles:
        key = percentile_key(p)
        out[key] = float(np.percentile(v, p))
        ci[key] = _quantile_ci(v, p / 100)
    out["ci"] = ci
    return out


def _col(d: dict, name: str) -> np.ndarray:
    return np.asarray(d[name])


#: events per slice when the event columns are read in time order (`_time_slices`): the
#: end of a cell holds one slice's intermediates, not the window's (issue 25)
SLICE_EVENTS = 1 << 18


def _time_slices(t: np.ndarray, size: int | None = None):
    """(start, end) slices of the event columns, cut only where ``t`` changes (one socket
    read's events stay together), or None when ``t`` goes back somewhere: records not in the
    loop's order are read whole, as before."""
    size = size or SLICE_EVENTS
    n = len(t)
    prev = None
    for s in range(0, n, size):
        chunk = t[s : s + size + 1]
        if np.any(chunk[1:] < chunk[:-1]) or (prev is not None and chunk[0] < prev):
            return None
        prev = chunk[-1]
    cuts = [0]
    while cuts[-1] < n:
        end = min(cuts[-1] + size, n)
        # move the cut forward to the next change of time
        while 0 < end < n and t[end] == t[end - 1]:
            step = t[end : end + size]
            same = np.flatnonzero(step != t[end - 1])
            end = end + int(same[0]) if len(same) else min(end + size, n)
        cuts.append(end)
    return list(itertools.pairwise(cuts))


def _event_reductions(events: dict, n: int):
    """Per request: the longest gap between consecutive events (ms; NaN with fewer than
    two), the tokens received (float) and the last event's time (-1 = none)."""
    q_all, t_all = _col(events, "request"), _col(events, "t_ns")
    tok_all = _col(events, "tokens")
    slices = _time_slices(t_all)
    if slices is None:
        slices = [(0, len(t_all))]
        whole = True
    else:
        whole = False
    mx = np.full(n, -np.inf)
    seen = np.zeros(n)
    last = np.full(n, -1, dtype=np.int64)
    had = np.zeros(n, dtype=bool)
    for s, e in slices:
        req = q_all[s:e].astype(np.int64)
        t = t_all[s:e].astype(np.int64)
        order = np.lexsort((t, req)) if whole else np.argsort(req, kind="stable")
        req, t = req[order], t[order]
        # each request's previous event: the one before it here, else its last one so far
        head = np.ones(len(req), dtype=bool)
        head[1:] = req[1:] != req[:-1]
        prev = np.empty_like(t)
        prev[1:] = t[:-1]
        prev[head] = last[req[head]]
        has = ~head | had[req]
        if has.any():
            np.maximum.at(mx, req[has], (t[has] - prev[has]) / 1e6)
        seen += np.bincount(req, weights=tok_all[s:e][order], minlength=n)[:n]
        tail = np.ones(len(req), dtype=bool)
        tail[:-1] = req[:-1] != req[1:]
        np.maximum.at(last, req[tail], t[tail])
        had[req[tail]] = True
    return np.where(np.isfinite(mx), mx, np.nan), seen, last


def per_request(requests: dict, events: dict | None = None) -> dict[str, np.ndarray]:
    """Per-request latencies in ms (NaN where undefined) for every record, aligned with the
    records: e2e_ms, ttft_ms, tpot_ms, e2e_sched_ms, ttft_sched_ms, queue_ms, and from
    ``events`` tbt_max_ms (the request's longest gap between token arrivals) and
    tpot_so_far_ms (first to last token received over the tokens between: the pace of a
    request cut before its end)."""
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
    if events is not None and len(_col(events, "t_ns")):
        tbt_max, seen, last = _event_reductions(events, n)
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


def _tbt_samples(requests: dict, events: dict | None, mask: np.ndarray) -> np.ndarray:
    """Per-token gaps (ms) of the masked requests' streams: a chunk's gap since the request's
    previous arrival, spread over the chunk's tokens, one sample per token (in no particular
    order: `distribution` sorts them)."""
    if events is None or not len(_col(events, "t_ns")):
        return np.empty(0)
    q_all, t_all = _col(events, "request"), _col(events, "t_ns")
    tok_all = _col(events, "tokens")
    slices = _time_slices(t_all)
    whole = slices is None
    slices = [(0, len(t_all))] if slices is None else slices
    n = len(mask)
    last = np.zeros(n, dtype=np.int64)  # each request's previous arrival, once `had`
    had = np.zeros(n, dtype=bool)
    pieces = []
    for s, e in slices:
        req = q_all[s:e].astype(np.int64)
        keep = mask[req]
        req = req[keep]
        t = t_all[s:e][keep].astype(np.int64)
        tok = tok_all[s:e][keep].astype(np.int64)
        order = np.lexsort((t, req)) if whole else np.argsort(req, kind="stable")
        req, t, tok = req[order], t[order], tok[order]
        # Events of one request at the same instant are one arrival (one socket read).
        if len(t):
            new = np.ones(len(t), dtype=bool)
            new[1:] = (req[1:] != req[:-1]) | (t[1:] != t[:-1])
            idx = np.cumsum(new) - 1
            tok = np.bincount(idx, weights=tok).astype(np.int64)
            req, t = req[new], t[new]
        head = np.ones(len(req), dtype=bool)
        head[1:] = req[1:] != req[:-1]
        prev = np.empty_like(t)
        prev[1:] = t[:-1]
        prev[head] = last[req[head]]
        has = ~head | had[req]
        gap = (t[has] - prev[has]) / 1e6
        ntok = np.maximum(tok[has], 1)
        pieces.append(np.repeat(gap / ntok, ntok))
        tail = np.ones(len(req), dtype=bool)
        tail[:-1] = req[:-1] != req[1:]
        last[req[tail]] = t[tail]
        had[req[tail]] = True
    return np.concatenate(pieces) if pieces else np.empty(0)


def cell_latency(
    requests: dict,
    events: dict | None,
    t0_ns: int,
    t1_ns: int,
    *,
    open_loop: bool = False,
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
) -> dict:
    """The latency distributions of one cell: ``{"e2e_ms", "ttft_ms", "tpot_ms", "tbt_ms"}``
    (each a :func:`distribution`), and for an open-loop cell also ``e2e_sched_ms``,
    ``ttft_sched_ms`` and ``queue_ms``. Only requests that completed OK count."""
    lat = per_request(requests, events)
    ok = counted_mask(requests, t0_ns, t1_ns, open_loop) & (_col(requests, "outcome") == OUTCOME_OK)
    names = ["e2e_ms", "ttft_ms", "tpot_ms"]
    if open_loop:
        names += ["e2e_sched_ms", "ttft_sched_ms", "queue_ms"]
    out = {name: distribution(lat[name][ok], percentiles) for name in names}
    # one sample per token: sorted in place, not copied (the gaps are finite by construction)
    samples = _tbt_samples(requests, events, ok)
    if not np.isfinite(samples).all():
        samples = samples[np.isfinite(samples)]
    samples.sort()
    out["tbt_ms"] = _sorted_distribution(samples, percentiles)
    return out


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
    growth_ratio: float = 1.5,
) -> dict:
    """What an open-loop cell did against what was asked.

    - ``arrivals``: window arrivals (scheduled in [t0, t1)); ``offered_rate_per_s`` =
      arrivals / D; ``achieved_rate_per_s`` = window requests actually sent in [t0, t1) / D;
      ``interarrival_cv``: coefficient of variation of the gaps between scheduled times;
    - ``completed`` / ``failed`` (errors) / ``cancelled`` (cut at the drain bound or never
      sent: ``unsent``); ``completed_rate_per_s`` = completed / D;
    - ``in_flight``: requests in flight at t0, t0 + bin, ... (a list), and its max;
    - ``queue_p99_ms``: p99 of sent − scheduled (the client's gate and send lateness);
    - ``kept_up`` and ``reason``: the server could not keep up when a window arrival was
      still unfinished at the drain bound, or when the median latency from the scheduled
      time of the last quarter of arrivals is more than ``growth_ratio`` times that of the
      first quarter (a backlog that grows through the window).
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
    kept_up, reason = True, ""
    if cancelled:
        kept_up = False
        reason = f"{cancelled} of {n} arrivals were unfinished when the drain bound passed" + (
            f" ({unsent} never sent)" if unsent else ""
        )
    else:
        e2e_sched = np.where((wout == OUTCOME_OK) & (wdone >= 0), (wdone - ws) / 1e6, np.nan)
        quarter = n // 4
        if quarter >= 5:
            first = (
                np.nanmedian(e2e_sched[:quarter])
                if np.isfinite(e2e_sched[:quarter]).any()
                else math.nan
            )
            last = (
                np.nanmedian(e2e_sched[-quarter:])
                if np.isfinite(e2e_sched[-quarter:]).any()
                else math.nan
            )
            if first > 0 and last > growth_ratio * first:
                kept_up = False
                reason = (
                    f"latency from the scheduled time grew from a median {first / 1000:.3g} s "
                    f"(first quarter of arrivals) to {last / 1000:.3g} s (last quarter)"
                )
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
