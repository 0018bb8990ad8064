"""Service-level objectives: attainment and goodput of a cell, and the capacity answer.

An SLO is a set of per-request latency targets (any subset of ``ttft``, ``tpot``, ``e2e``,
``tbt``), written ``ttft=2s,tpot=50ms,e2e=60s``. A request *meets the SLO* when it completed
OK and each of its figures is within its target:

- ``ttft`` and ``e2e``: from the scheduled time in an open-loop cell (what the user who
  arrived then waited), from the send in a closed-loop cell (where the two are the same);
- ``tpot``: ``(e2e − ttft) / (output − 1)`` from the send (a request with one token has no
  TPOT and meets any TPOT target);
- ``tbt``: the request's longest gap between token arrivals (the stall a user sees).

Per cell (the requests :func:`speedmatrix.latency.counted_mask` counts; failed, and in open
loop unfinished, requests count and miss; in closed loop a request cut at the window's end
after its first token, whenever it was sent (the first wave included: with long outputs
it is most of what a window holds), is judged on TTFT, its TPOT so far and its stalls so
far, and on E2E only when its elapsed time already exceeds the target, else left out):
``attainment`` = meeting / counted, ``goodput_req_s`` = completed requests meeting the
SLO / D, ``goodput_tok_s`` = output tokens of the requests meeting it / D (closed loop:
only their tokens that arrived inside the window, as total tok/s counts them), and
``failed_most``: the target most requests missed (``"error"`` when failures outnumber every
target's misses).

The capacity answer, per context: over loads (concurrencies or rates) measured in increasing
order, the largest load whose attainment is at least the asked one, the first larger load
that falls below it, and an estimate between them by linear interpolation of attainment
against load (``method`` names it). :func:`search` finds the boundary by measuring: it
brackets (doubling or halving) and then bisects until the bracket is within 10% or the cell
budget is spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from speedmatrix import latency
from speedmatrix.units import parse_duration

__all__ = [
    "DEFAULT_ATTAINMENT",
    "SLO_METRICS",
    "capacity",
    "capacity_table",
    "cell_figures",
    "evaluate",
    "format_slo",
    "markdown_matrix",
    "parse_attainment",
    "parse_slo",
    "run_capacity",
    "search",
]

# Target name -> the per-request column of latency.per_request it is judged on
# (closed loop, open loop).
SLO_METRICS: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_ms", "ttft_sched_ms"),
    "tpot": ("tpot_ms", "tpot_ms"),
    "e2e": ("e2e_ms", "e2e_sched_ms"),
    "tbt": ("tbt_max_ms", "tbt_max_ms"),
}
_ALIASES = {"itl": "tbt", "e2el": "e2e"}
#: the share of requests that must meet the SLO when none is asked (not a confidence level)
DEFAULT_ATTAINMENT = 0.95


def parse_slo(text: str | dict) -> dict[str, float]:
    """``"ttft=2s,tpot=50ms"`` -> ``{"ttft": 2000.0, "tpot": 50.0}`` (targets in ms).
    A bare number is seconds. Raises ValueError naming the offending item."""
    if isinstance(text, dict):
        items = [f"{k}={v}" for k, v in text.items()]
    else:
        items = [s for s in str(text).split(",") if s.strip()]
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        name = _ALIASES.get(name, name)
        if not sep or name not in SLO_METRICS:
            raise ValueError(
                f"--slo: {item.strip()!r} is not NAME=DURATION with NAME one of "
                f"{', '.join(SLO_METRICS)} (e.g. ttft=2s,tpot=50ms)"
            )
        try:
            seconds = parse_duration(value.strip())
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--slo {name}: {exc}") from None
        if not seconds > 0:
            raise ValueError(f"--slo {name}: the target must be above 0")
        out[name] = seconds * 1000.0
    if not out:
        raise ValueError("--slo: no targets given (e.g. ttft=2s,tpot=50ms)")
    return out


def format_slo(slo: dict[str, float]) -> str:
    """``{"ttft": 2000, "tpot": 50}`` -> ``"ttft=2s,tpot=50ms"``."""

    def fmt(ms: float) -> str:
        return f"{ms / 1000:g}s" if ms >= 1000 else f"{ms:g}ms"

    return ",".join(f"{k}={fmt(v)}" for k, v in slo.items())


def parse_attainment(text: str | float) -> float:
    """``"95%"``, ``"95"``, ``0.95`` -> 0.95. Raises ValueError outside (0, 100%]."""
    s = str(text).strip()
    pct = s.endswith("%")
    try:
        v = float(s.rstrip("%"))
    except ValueError:
        raise ValueError(f"--attainment: {text!r} is not a share (e.g. 95%)") from None
    if pct or v > 1:
        v /= 100
    if not (0 < v <= 1):
        raise ValueError(f"--attainment: {text!r} is not between 0 and 100%")
    return v


def evaluate(
    requests: dict,
    events: dict | None,
    t0_ns: int,
    t1_ns: int,
    slo: dict[str, float],
    *,
    open_loop: bool = False,
) -> dict[str, Any]:
    """Attainment and goodput of one cell against ``slo`` (targets in ms, from
    :func:`parse_slo`): ``{"slo", "counted", "met", "attainment", "goodput_req_s",
    "goodput_tok_s", "missed": {target: n, "error": n}, "failed_most"}``."""
    lat = latency.per_request(requests, events)
    counted = latency.counted_mask(requests, t0_ns, t1_ns, open_loop)
    outcome = np.asarray(requests["outcome"])
    ok = counted & (outcome == latency.OUTCOME_OK)
    cut = np.zeros_like(ok)
    if not open_loop:
        # Closed loop: a request cut at the window's end after its first token is judged on
        # what it showed (TTFT, its pace so far, its stalls); on E2E only once its elapsed
        # time already exceeds the target, else it is left out (undecided).
        sent = np.asarray(requests["sent_ns"])
        first = np.asarray(requests["first_token_ns"])
        cut = (
            (np.asarray(requests["phase"]) == 1)
            & (outcome == latency.OUTCOME_CANCELLED)
            & (sent >= 0)
            & (sent <= t1_ns)
            & (first >= 0)
            & (first <= t1_ns)
        )
        if "e2e" in slo:
            elapsed_ms = (t1_ns - sent) / 1e6
            cut &= elapsed_ms > slo["e2e"]
            lat = dict(lat)
            lat["e2e_ms"] = np.where(cut, elapsed_ms, lat["e2e_ms"])
        lat["tpot_ms"] = np.where(cut, lat["tpot_so_far_ms"], lat["tpot_ms"])
        counted = counted | cut
    judged = ok | cut
    met = judged.copy()
    missed: dict[str, int] = {}
    for name, target in slo.items():
        col = lat[SLO_METRICS[name][1 if open_loop else 0]]
        # An undefined figure (a one-token request's TPOT, a one-chunk stream's TBT)
        # cannot miss its target.
        fails = judged & np.isfinite(col) & (col > target)
        missed[name] = int(fails.sum())
        met &= ~fails
    missed["error"] = int((counted & ~judged).sum())
    n_counted = int(counted.sum())
    n_met = int(met.sum())
    d_s = (t1_ns - t0_ns) / 1e9
    out_tok = np.asarray(requests["output_tokens"]).astype(float)
    if not open_loop and events is not None:
        out_tok = _window_tokens(requests, events, t0_ns, t1_ns)
    worst = max(missed.items(), key=lambda kv: kv[1]) if missed else ("", 0)
    return {
        "slo": dict(slo),
        "counted": n_counted,
        "met": n_met,
        "attainment": n_met / n_counted if n_counted else math.nan,
        "goodput_req_s": int((met & ok).sum()) / d_s if d_s > 0 else math.nan,
        "goodput_tok_s": float(out_tok[met].sum()) / d_s if d_s > 0 else math.nan,
        "missed": missed,
        "failed_most": worst[0] if worst[1] > 0 else None,
    }


def _window_tokens(requests: dict, events: dict, t0_ns: int, t1_ns: int) -> np.ndarray:
    """Per request, the tokens of its arrivals in [t0, t1] (`latency.request_tokens`, usage
    scaled: the window's tokens exactly as the cell's total tok/s counts them)."""
    if not len(events.get("t_ns", ())):
        return np.zeros(len(requests["sent_ns"]))
    return latency.request_tokens(requests, events, t0_ns, t1_ns)["window_tokens"].astype(float)


_METHOD = "linear interpolation of attainment between the last passing and first failing loads"


def capacity(points: list[tuple[float, float]], attainment: float) -> dict[str, Any]:
    """The capacity answer for one context from measured ``(load, attainment)`` points.

    Returns ``{"passing": load|None, "failing": load|None, "estimate": float|None,
    "method": str, "points": [[load, attainment], ...]}``. ``passing`` is the largest load
    meeting ``attainment`` below which every measured load also meets it (a noisy pass above
    a failure does not count); ``failing`` the first measured load above ``passing`` that does
    not. The estimate is the interpolated load where attainment crosses the target; with no
    failing load it is None ("at least ``passing``"), with no passing load it is None ("below
    the smallest measured load"). Points with NaN attainment are ignored."""
    pts = sorted((float(x), float(a)) for x, a in points if not math.isnan(float(a)))
    passing = failing = None
    pa = fa = math.nan
    for x, a in pts:
        if a >= attainment:
            passing, pa = x, a
        else:
            failing, fa = x, a
            break
    estimate = None
    method = _METHOD
    if passing is not None and failing is not None:
        estimate = passing + (pa - attainment) / (pa - fa) * (failing - passing)
    elif passing is not None:
        method = "no measured load failed: capacity is at least the largest measured"
    elif failing is not None:
        method = "every measured load failed: capacity is below the smallest measured"
    else:
        method = "no measured points"
    return {
        "passing": passing,
        "failing": failing,
        "estimate": estimate,
        "method": method,
        "points": [[x, a] for x, a in pts],
    }


def search(
    measure: Callable[[float], float],
    start: float,
    attainment: float,
    *,
    integer: bool = True,
    max_cells: int = 8,
    tolerance: float = 0.10,
    lowest: float = 1,
) -> dict[str, Any]:
    """Finds the largest load meeting ``attainment`` by measuring as few cells as it can.

    ``measure(load) -> attainment`` runs one cell. From ``start`` it doubles while the load
    passes (halves while it fails, down to ``lowest``) until a passing and a failing load
    bracket the boundary, then bisects (geometric midpoint; integers for concurrency) until
    ``(failing − passing) / passing <= tolerance``, two integer loads are adjacent, or
    ``max_cells`` cells were measured. Returns :func:`capacity` of the measured points plus
    ``"cells"`` (how many were measured) and ``"converged"``."""
    measured: dict[float, float] = {}

    def at(x: float) -> float:
        x = float(round(x)) if integer else float(x)
        if x not in measured:
            measured[x] = measure(x)
        return measured[x]

    def done(lo: float | None, hi: float | None) -> bool:
        if lo is None or hi is None:
            return False
        return (hi - lo) / lo <= tolerance or (integer and hi - lo <= 1)

    lo: float | None = None
    hi: float | None = None
    x = float(round(start)) if integer else float(start)
    x = max(x, lowest)
    while len(measured) < max_cells and (lo is None or hi is None):
        if at(x) >= attainment:
            lo = x
            if hi is None:
                x = x * 2
        else:
            hi = x
            if lo is None:
                if x <= lowest:
                    break
                x = max(x / 2, lowest)
                x = float(round(x)) if integer else x
    while len(measured) < max_cells and not done(lo, hi) and lo is not None and hi is not None:
        mid = math.sqrt(lo * hi)
        if integer:
            mid = float(round(mid))
            if mid <= lo:
                mid = lo + 1
            if mid >= hi:
                mid = hi - 1
        if at(mid) >= attainment:
            lo = mid
        else:
            hi = mid
    out = capacity(list(measured.items()), attainment)
    out["cells"] = len(measured)
    out["converged"] = done(lo, hi)
    return out


def _json_ready(v: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> Python, recursively: what run.json can hold."""
    if isinstance(v, dict):
        return {k: _json_ready(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_ready(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    return v


def cell_figures(
    requests: dict,
    events: dict | None,
    t0_ns: int,
    t1_ns: int,
    *,
    rate_per_s: float | None = None,
    percentiles: tuple[float, ...] = latency.DEFAULT_PERCENTILES,
    slo: dict[str, float] | None = None,
    core: dict | None = None,
) -> dict[str, Any]:
    """The fields this module and :mod:`speedmatrix.latency` add to a cell of run.json, from
    its records: ``latency`` (distributions), ``coalesced_share`` (with token events),
    ``open_loop`` (a rate cell, ``rate_per_s`` set) and ``slo`` (with ``slo`` targets).
    JSON-ready (NaN -> null). ``core``: the cell's `_core.summarize_cell` already made
    (`latency.cell_latency`'s)."""
    open_loop = rate_per_s is not None
    out: dict[str, Any] = {
        "latency": latency.cell_latency(
            requests,
            events,
            t0_ns,
            t1_ns,
            open_loop=open_loop,
            percentiles=percentiles,
            core=core,
        )
    }
    share = latency.coalesced_share(requests, events, t0_ns, t1_ns)
    if math.isfinite(share):
        out["coalesced_share"] = share
    if rate_per_s is not None:
        out["open_loop"] = latency.open_loop_figures(requests, t0_ns, t1_ns, float(rate_per_s))
    if slo:
        out["slo"] = evaluate(requests, events, t0_ns, t1_ns, slo, open_loop=open_loop)
    return _json_ready(out)


def run_capacity(
    cells: list[dict],
    load_records: Callable[[str], tuple[dict, dict | None] | None],
    slo: dict[str, float],
    attainment: float = DEFAULT_ATTAINMENT,
) -> dict[int, dict[str, Any]]:
    """The capacity answer of a saved run, per decode context: ``{context: capacity(...) +
    {"by": "concurrency"|"rate", "label"}}``. Each measured decode cell (status valid,
    queued or error, with records) is judged against ``slo`` from its own records (the run's
    saved figures are not trusted for a different SLO); a cell marked over capacity without
    records counts as failing (attainment 0). Repetitions of one load pool their requests'
    attainment by averaging. ``load_records(cell_id)`` gives (requests, events) or None."""
    per_ctx: dict[int, dict[float, list[float]]] = {}
    by_of: dict[int, str] = {}
    labels: dict[int, str] = {}
    for c in cells:
        if c.get("phase") != "decode" or not c.get("context"):
            continue
        rate = c.get("rate_per_s")
        by = "rate" if rate else "concurrency"
        load = float(rate) if rate else float(c.get("concurrency") or 0)
        if load <= 0:
            continue
        ctx = int(c["context"])
        by_of.setdefault(ctx, by)
        labels.setdefault(ctx, c.get("label") or str(ctx))
        a: float | None = None
        rec = load_records(c["id"]) if c.get("records") else None
        if rec is not None and c.get("t0_ns") and c.get("t1_ns"):
            req, ev = rec
            a = evaluate(req, ev, int(c["t0_ns"]), int(c["t1_ns"]), slo, open_loop=bool(rate))[
                "attainment"
            ]
        elif c.get("status") == "over_capacity":
            a = 0.0
        if a is None or math.isnan(a):
            continue
        per_ctx.setdefault(ctx, {}).setdefault(load, []).append(a)
    out: dict[int, dict[str, Any]] = {}
    for ctx in sorted(per_ctx):
        pts = [(x, float(np.mean(v))) for x, v in per_ctx[ctx].items()]
        cap = capacity(pts, attainment)
        cap["by"] = by_of[ctx]
        cap["label"] = labels[ctx]
        out[ctx] = cap
    return out


def capacity_table(
    caps: dict[int, dict[str, Any]], slo: dict[str, float], attainment: float
) -> str:
    """A minimal markdown table of :func:`run_capacity`'s answer."""

    def num(v: float | None) -> str:
        return "—" if v is None else f"{v:g}" if float(v).is_integer() else f"{v:.3g}"

    lines = [
        f"Capacity at SLO {format_slo(slo)}, attainment {attainment:.0%}",
        "",
        "| Context | Load | Largest passing | First failing | Estimate | Method |",
        "|---|---|---|---|---|---|",
    ]
    for cap in caps.values():
        lines.append(
            f"| {cap['label']} | {cap['by']} | {num(cap['passing'])} | {num(cap['failing'])} "
            f"| {num(cap['estimate'])} | {cap['method']} |"
        )
    return "\n".join(lines) + "\n"


def markdown_matrix(df: Any, title: str, fmt: str = "{:.3g}") -> str:
    """A minimal markdown table of a `Run.load_matrix` frame (numbers formatted by ``fmt``,
    status text as it is, NaN as an em dash)."""
    cols = list(df.columns)
    head = f"| {df.index.name or ''} \\ {df.columns.name or ''} | " + " | ".join(
        f"{c:g}" if isinstance(c, float) else str(c) for c in cols
    )
    lines = [title, "", head + " |", "|---" * (len(cols) + 1) + "|"]
    for label, row in df.iterrows():
        cells = []
        for v in row:
            if isinstance(v, (int, float, np.floating)) and not isinstance(v, bool):
                cells.append("—" if math.isnan(float(v)) else fmt.format(float(v)))
            else:
                cells.append(str(v))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
