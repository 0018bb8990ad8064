"""A cell's stored form: its figures, status and flags, from its records.

Over 500 lines: a decode cell's figures, evidence and status are gathered from one window
in one place, so none of them reads another set of requests.

`decode_cell` gathers the figures (`_core.summarize_cell`, `speedmatrix.slo.cell_figures`),
the evidence the flag rules read (`speedmatrix.verdict.flags`) and the status rule's inputs
(`speedmatrix.verdict.status`); `prefill_cell`, `unrun_cell` and `prompt_failure_cell`
make the other kinds of cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from speedmatrix import figures, slo
from speedmatrix._native import _core
from speedmatrix.reasoning import hidden_evidence, reasoning_figures
from speedmatrix.records import Records
from speedmatrix.verdict import openloop, preemption, window
from speedmatrix.verdict.cache import cache_columns
from speedmatrix.verdict.client import cell_headroom
from speedmatrix.verdict.counts import (
    ERROR_EXAMPLE_CHARS,
    error_counts,
    error_examples,
    finite,
    interval,
    prompt_check,
)
from speedmatrix.verdict.flags import Evidence, flags_of
from speedmatrix.verdict.names import Status
from speedmatrix.verdict.refusal import refused_for_capacity
from speedmatrix.verdict.rules import EngineFacts, Rules
from speedmatrix.verdict.server import server_view
from speedmatrix.verdict.status import decode_status, error_text

__all__ = [
    "ERROR_EXAMPLE_CHARS",
    "CellShape",
    "base_cell",
    "decode_cell",
    "prefill_cell",
    "prefill_rows",
    "prompt_check",
    "prompt_failure_cell",
    "unrun_cell",
]


class _Shape(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def context(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def repetition(self) -> int: ...


@dataclass(frozen=True)
class CellShape:
    """What the plan said about a cell; `from_cell` reads it back from a stored cell."""

    id: str
    phase: str
    context: int
    label: str
    concurrency: int
    repetition: int = 0
    #: a request-rate (open-loop) cell: its arrival rate and law
    rate_per_s: float | None = None
    arrival: str = "poisson"
    prompts_file: str = ""
    #: "measured": the plan left the capacity verdict to the measurement
    capacity_check: str = ""
    kv_admit_share: float = 0.0
    #: a cached-fraction cell: the share asked and the counters read around it
    cached_fraction: float | None = None
    cache_counters: dict | None = None
    #: an interference cell: seconds between its prefills; a trace replay: file, speed-up
    interference_every_s: float = 0.0
    trace: str = ""
    speedup: float = 1.0
    #: a sessions cell: turns, new tokens a turn, think time, the answer's tokens
    sessions: int = 0
    turn_tokens: int = 0
    think_time_s: float = 0.0
    max_output: int = 0

    @classmethod
    def from_cell(cls, cell: dict) -> CellShape:
        return cls(
            id=cell["id"],
            phase=cell["phase"],
            context=int(cell["context"]),
            label=cell.get("label") or "",
            concurrency=int(cell["concurrency"]),
            repetition=int(cell.get("repetition", 0)),
            rate_per_s=cell.get("rate_per_s"),
            arrival=cell.get("arrival") or "poisson",
            prompts_file=cell.get("prompts_file") or "",
            capacity_check=cell.get("capacity_check") or "",
            kv_admit_share=float(cell.get("kv_admit_share") or 0.0),
            cached_fraction=cell.get("cached_fraction"),
            cache_counters=cell.get("cache_counters"),
            interference_every_s=float(cell.get("interference_every_s") or 0.0),
            trace=cell.get("trace") or "",
            speedup=float(cell.get("speedup") or 1.0),
            sessions=int(cell.get("sessions") or 0),
            turn_tokens=int(cell.get("turn_tokens") or 0),
            think_time_s=float(cell.get("think_time_s") or 0.0),
            max_output=int(cell.get("session_answer_tokens") or 0),
        )


# ------------------------------------------------------------------------------ cells
def base_cell(shape: _Shape) -> dict:
    """The fields every stored cell has, figures empty."""
    return {
        "id": shape.id,
        "phase": shape.phase,
        "context": int(shape.context),
        "label": shape.label,
        "concurrency": int(shape.concurrency),
        "repetition": int(shape.repetition),
        "status": None,
        "total_tok_s": None,
        "per_request_tok_s": None,
        "prompt_tok_s": None,
        "ttft_ms": None,
        "tbt_ms": None,
        "avg_active": None,
        "completed": 0,
        "output_tokens": 0,
        "measured_s": 0.0,
        "errors": {},
        **_open_loop_shape(shape),
    }


def _open_loop_shape(shape: _Shape) -> dict:
    out: dict = {}
    prompts_file = getattr(shape, "prompts_file", "")
    if prompts_file:
        out["prompts_file"] = prompts_file
    rate = getattr(shape, "rate_per_s", None)
    if rate is not None:
        out.update(rate_per_s=float(rate), arrival=getattr(shape, "arrival", "poisson"))
    if getattr(shape, "cached_fraction", None) is not None:
        out["cached_fraction"] = float(shape.cached_fraction)  # type: ignore[attr-defined]
    if getattr(shape, "trace", ""):
        out.update(trace=shape.trace, speedup=float(shape.speedup))  # type: ignore[attr-defined]
    return out


def unrun_cell(shape: _Shape, status: str, reason: str | None) -> dict:
    """A cell the plan will not run (over capacity, does not fit)."""
    base = base_cell(shape)
    base["status"] = status
    if reason:
        base["reason"] = reason
    return base


def prompt_failure_cell(shape: _Shape, kind: str, message: str) -> dict:
    """An `error` cell whose prompts could not be made (nothing was sent)."""
    message = message[:ERROR_EXAMPLE_CHARS]
    base = base_cell(shape)
    base.update(
        {
            "status": Status.ERROR.value,
            "errors": {kind: 1},
            "errors_total": 1,
            "error_examples": {kind: message},
            "flags": [],
            "reason": f"prompts of {shape.context} tokens could not be made: {message}",
        }
    )
    return base


def prefill_cell(
    shape: _Shape,
    records: Records,
    *,
    idle: bool,
    measured_in: str | None = None,
) -> dict:
    """A prefill cell: the median cold TTFT of its request(s).

    Measured on its own (``measured_in`` None), the request is the window's one;
    measured during the N=1 decode cell ``measured_in``'s warm-up, it is that cell's
    first warm-up request."""
    req = records.requests
    rows = prefill_rows(records, measured_in is not None)
    base = base_cell(shape)
    errors: dict[str, int] = {}
    ttfts = []
    reported = []
    for i in rows:
        if req["outcome"][i] == window.ERROR:
            kind = req["error_kind"][i] or "unknown"
            errors[kind] = errors.get(kind, 0) + 1
        elif req["first_token_ns"][i] > 0:
            ttfts.append((req["first_token_ns"][i] - req["sent_ns"][i]) / 1e6)
        if req["prompt_tokens"][i] >= 0:
            reported.append(int(req["prompt_tokens"][i]))
    ttft = float(np.median(ttfts)) if ttfts else None
    base.update(
        {
            "status": Status.VALID.value if ttft is not None else Status.ERROR.value,
            "prompt_tok_s": shape.context / (ttft / 1000.0) if ttft else None,
            "ttft_ms": ttft,
            "completed": len(ttfts),
            "errors": errors,
            "error_examples": error_examples(req, rows),
            "errors_total": sum(errors.values()),
            "prompt_tokens": prompt_check(shape.context, reported),
        }
    )
    # a prefill cell's flags: the rules that read what one cold request shows
    evidence = Evidence(idle=idle, prompt_exact=base["prompt_tokens"]["exact"])
    base["flags"] = flags_of(evidence, Rules())
    if measured_in:
        base["measured_in"] = measured_in
    if fatal := records.fatal_error:
        base["reason"] = fatal
    if ttft is None and not base.get("reason"):
        base["reason"] = "no first token: " + error_text(errors, base["error_examples"])
    if ttft is None:
        status, reason = refused_for_capacity(
            Status.ERROR, base.get("reason"), base["error_examples"]
        )
        base["status"], base["reason"] = status.value, reason
    return base


def prefill_rows(records: Records, from_warmup: bool) -> np.ndarray:
    """The request rows a prefill figure is taken from."""
    phase = records.requests["phase"]
    if from_warmup:
        # the first warm-up prompt; when its first try failed or timed out and was
        # sent again (warmup_retried), the try that answered
        first = np.flatnonzero((phase == 0) & (records.requests["body"] == 0))
        ok = first[records.requests["outcome"][first] == window.OK]
        return ok[:1] if len(ok) else first[:1]
    return np.flatnonzero(phase == 1)


def decode_cell(
    shape: _Shape,
    records: Records,
    facts: EngineFacts,
    rules: Rules,
    *,
    idle: bool,
    percentiles: tuple[float, ...] | list[float] | None = None,
    slo_targets: dict[str, float] | None = None,
    client_roofline: dict | None = None,
) -> dict:
    """A decode cell: figures of its window, its status and flags; with its latency
    distributions (`percentiles`), SLO attainment and goodput (`slo_targets`, ms), for
    a request-rate cell what the open loop did (`speedmatrix.slo.cell_figures`), and with
    the host's `client_roofline` (`speedmatrix selftest`) the client's headroom."""
    base = base_cell(shape)
    req = records.requests
    errors = error_counts(req, np.flatnonzero(req["phase"] == 1))
    w = _window(shape, records)
    if w is None:
        return _never_started(base, records, errors, idle=idle, facts=facts)
    pct = tuple(percentiles or figures.DEFAULT_PERCENTILES)
    fig = _window_figures(base, shape, records, facts, errors, w, figures.tbt_levels(pct))
    unserved, unserved_longer = window.ttft_unserved(req, w.ramp, w.t1, base["ttft_ms"])
    base["ttft_unserved"] = unserved
    base["flags"] = []
    rate = getattr(shape, "rate_per_s", None)
    base.update(_distributions(records, w.t0, w.t1, rate, pct, slo_targets, fig))
    base.update(reasoning_figures(req, w.ramp, w.t1))
    if not w.open_loop:
        # the send of the first N to the window's opening (a run saved before steady
        # windows opened at the send: its ramp is the first wave's settling)
        base["ramp_s"] = (w.settle - w.ramp) / 1e9
        base["first_wave_streamed"] = window.first_wave_streamed(req, shape.concurrency)
    base["waiting_without_tokens"] = window.client_queue_signal(req, w.settle, w.t1)
    base["client_headroom"] = cell_headroom(records, w.t0, w.t1, client_roofline)
    base.update(cache_columns(shape, records))
    e = _evidence(base, shape, records, facts, fig, w, idle=idle, unserved_longer=unserved_longer)
    if e.usage_below or e.usage_above:
        base["usage_mismatch"] = {"below_chunks": e.usage_below, "above_chunks": e.usage_above}
    if e.warmup_unfinished:
        base["warmup_unfinished"] = e.warmup_unfinished
    base["flags"] = flags_of(e, rules)
    # failures count against the requests sent from the ramp's start, or an open loop's arrivals
    started = max(int(base["open_loop"]["arrivals"]), 1) if w.open_loop else e.started
    status, reason = decode_status(
        rules,
        errors=errors,
        error_examples=base["error_examples"],
        started=started,
        output_tokens=base["output_tokens"],
        server=base["server"],
        queued_client=base["waiting_without_tokens"],
        stopped_by=records.stopped_by,
        stop_reason=records.stop_reason,
        concurrency=None if w.open_loop else int(shape.concurrency),
    )
    status, reason = refused_for_capacity(status, reason, base["error_examples"])
    base["status"] = status.value
    if reason:
        base["reason"] = reason
    admit_share = float(getattr(shape, "kv_admit_share", 0.0))
    preemption.apply_preemptions(
        base,
        preemption.preemptions_in(records.metrics, facts.metric_preemptions),
        preemption.capacity_check_of(shape),
        preemption.waited_for_kv(records.metrics, facts, admit_share),
        admit_share,
    )
    return base


#: the figures whose 95% confidence interval a decode cell carries (``ci``)
CI_FIGURES = ("total_tok_s", "per_request_tok_s", "decode_tok_s_per_request", "ttft_ms", "tbt_ms")


@dataclass(frozen=True)
class _Window:
    """A decode cell's window [t0, t1], the ramp's start and the first wave's settling."""

    t0: int
    t1: int
    ramp: int
    settle: int
    steady: bool
    open_loop: bool


def _window(shape: _Shape, records: Records) -> _Window | None:
    """The cell's window, None when it never started."""
    t0, t1 = int(records.window_start_ns), int(records.window_end_ns)
    if t0 <= 0 or t1 <= t0:
        return None
    open_loop = getattr(shape, "rate_per_s", None) is not None
    # A steady-state window (DESIGN.md "Window") opens once the first wave streams:
    # t0 is the settle point and TTFT counts from the ramp's start (the first wave and
    # every refill). Runs saved before it (no ramp_start_ns) and the cached-fraction
    # cells (one request a slot: the core opens a max_requests window at the send)
    # opened at the send. An open-loop cell has no first wave: its window is its arrivals'.
    one_wave = getattr(shape, "cached_fraction", None) is not None
    steady = not open_loop and not one_wave and int(records.ramp_start_ns) > 0
    ramp = int(records.ramp_start_ns) if steady else t0
    req = records.requests
    settle = (
        t0 if (open_loop or steady) else window.first_wave_settled(req, shape.concurrency, t0, t1)
    )
    return _Window(t0, t1, ramp, settle, steady, open_loop)


def _evidence(
    base: dict,
    shape: _Shape,
    records: Records,
    facts: EngineFacts,
    fig: dict,
    w: _Window,
    *,
    idle: bool,
    unserved_longer: int,
) -> Evidence:
    """What the flag rules read, from the cell's figures and its records."""
    req = records.requests
    in_window = req["phase"] == 1
    # every window request sent from the ramp's start: the first wave and its refills
    sent = in_window & (req["sent_ns"] >= w.ramp) & (req["sent_ns"] <= w.t1)
    below, above = window.usage_mismatches(req["token_source"][in_window])
    ol = base.get("open_loop") or {}
    return Evidence(
        idle=idle,
        output_forced=facts.output_forced,
        drifting=bool(fig.get("drifting")),
        prompt_exact=base["prompt_tokens"]["exact"],
        tokens_estimated=window.tokens_estimated(
            req["token_source"][in_window],
            req["outcome"][in_window],
            req["token_source"][req["phase"] == 0],
            req["outcome"][req["phase"] == 0],
        ),
        # client CPU covers the whole cell, warm-up included
        client_cpu_s=float(records.client_cpu_s),
        cell_s=(int(records.end_ns) - int(records.warmup_start_ns)) / 1e9,
        client_headroom=base["client_headroom"],
        concurrency=int(shape.concurrency),
        open_loop=w.open_loop,
        running_mean=(base["server"] or {}).get("running_mean"),
        started=max(int(np.count_nonzero(sent)), 1),
        unserved_longer=unserved_longer,
        stalls=int(base["stalls"]),
        http_429=int(base["errors"].get("http_429", 0)),
        kept_up=bool(ol["kept_up"]) if w.open_loop else None,
        steady=w.steady,
        ramp_capped=bool(records.ramp_capped),
        first_wave_streamed=int(base.get("first_wave_streamed", 0)),
        ramp_ns=w.settle - w.t0,
        window_ns=w.t1 - w.t0,
        usage_below=below,
        usage_above=above,
        warmup_unfinished=window.warmup_unfinished(req),
        coalesced_share=finite(base.get("coalesced_share", fig.get("coalesced_share"))),
        cached_fraction=base.get("cached_fraction"),
        delivered_cached_fraction=base.get("delivered_cached_fraction"),
        reasoning=hidden_evidence(req),
    )


def _never_started(
    base: dict, records: Records, errors: dict[str, int], *, idle: bool, facts: EngineFacts
) -> dict:
    """A decode cell whose window never started: the warm-up's failures say why."""
    req = records.requests
    errors = errors or error_counts(req, np.flatnonzero(req["phase"] == 0))
    examples = error_examples(req, np.flatnonzero(req["outcome"] == window.ERROR))
    never = records.fatal_error or "the window never started (every warm-up request failed)" + (
        f": {error_text(errors, examples)}" if errors else ""
    )
    status, reason = refused_for_capacity(Status.ERROR, never, examples)
    base.update(
        {
            "status": status.value,
            "errors": errors,
            "error_examples": examples,
            "errors_total": sum(errors.values()),
            "reason": reason,
            "flags": flags_of(Evidence(idle=idle, output_forced=facts.output_forced), Rules()),
        }
    )
    return base


def _distributions(
    records: Records,
    t0: int,
    t1: int,
    rate: float | None,
    pct: tuple[float, ...],
    slo_targets: dict[str, float] | None,
    fig: dict,
) -> dict:
    """Latency distributions, SLO attainment and goodput, open-loop figures; ``fig``: the
    cell's `_core.summarize_cell` (made with ``figures.tbt_levels(pct)``), read, not redone."""
    extra = slo.cell_figures(
        records.requests,
        records.events,
        t0,
        t1,
        rate_per_s=rate,
        percentiles=pct,
        slo=slo_targets or None,
        core=fig,
        kept_up=openloop.kept_up,
    )
    extra["latency"]["percentiles"] = [float(p) for p in pct]
    return extra


def _window_figures(
    base: dict,
    shape: _Shape,
    records: Records,
    facts: EngineFacts,
    errors: dict[str, int],
    w: _Window,
    tbt_qs: list[float],
) -> dict:
    """Puts the window's figures (C++), the server's view and the prompt check in ``base``;
    returns the C++ figures (with the TBT sample set's quantiles at ``tbt_qs``)."""
    req, ev = records.requests, records.events
    t0, t1, settle = w.t0, w.t1, w.settle
    in_window = req["phase"] == 1
    fig = _core.summarize_cell(req, ev, t0, t1, 1.0, settle, w.ramp, tbt_qs)
    server = server_view(records.metrics, facts, t0, t1, settle)
    reported = [int(x) for x in req["prompt_tokens"][in_window] if x >= 0]
    ptok = prompt_check(shape.context, reported)
    if getattr(shape, "prompts_file", ""):
        # a workload file's prompts have their own lengths: the server's counts are kept
        # per request in the records, and the range here; nothing was asked to compare
        ptok.update(asked=None, exact=None)
    base.update(
        {
            "total_tok_s": finite(fig["total_tok_s"]),
            "per_request_tok_s": finite(fig["per_request_tok_s"]),
            "decode_tok_s_per_request": finite(fig.get("decode_tok_s_per_request")),
            "decode_requests": int(fig.get("decode_requests", 0)),
            "ttft_ms": finite(fig["ttft_ms"]),
            "ttft_first_wave_ms": finite(fig.get("ttft_first_wave_ms")),
            "tbt_ms": finite(fig["tbt_ms"]),
            "avg_active": finite(fig["avg_active"]),
            "completed": int(fig["completed"]),
            "output_tokens": int(fig["output_tokens"]),
            "measured_s": finite(fig["measured_s"]) or 0.0,
            "started": int(fig["started"]),
            "errors": errors,
            "error_examples": error_examples(
                req, np.flatnonzero(in_window & (req["outcome"] == window.ERROR))
            ),
            "errors_total": sum(errors.values()),
            # re-sent on a new connection after a kept-alive one died before any byte of
            # the answer (a keep-alive close racing the request): counted apart, not errors
            "retried": int(np.count_nonzero(req["retries"][in_window])) if "retries" in req else 0,
            "t0_ns": t0,
            "t1_ns": t1,
            "ramp_start_ns": int(records.ramp_start_ns),
            "ramp_capped": bool(records.ramp_capped),
            "warmup_start_ns": int(records.warmup_start_ns),
            "end_ns": int(records.end_ns),
            "ci": {k: interval(fig.get(f"{k}_ci")) for k in CI_FIGURES},
            # the larger relative half-width of the total tok/s and TBT intervals
            "precision": finite(fig.get("precision")),
            "stopped_by": records.stopped_by or None,
            "stalls": int(errors.get("stall", 0)),
            # slot waits the core imposed after a 429 (errors.http_429) or a failed
            # connection, and the slot time they took in the window (closed loop)
            "backoffs": int(records.backoffs),
            "backoff_s": finite(float(records.backoff_s)) or 0.0,
            # slot time the failed streams held silent in the window (a stall's wait)
            "error_slot_s": finite(fig.get("error_slot_s")),
            "warmup_retried": int(records.warmup_retried),
            "ttft_p90_ms": finite(fig.get("ttft_p90_ms")),
            "ttft_p99_ms": finite(fig.get("ttft_p99_ms")),
            "tbt_p90_ms": finite(fig.get("tbt_p90_ms")),
            "tbt_p99_ms": finite(fig.get("tbt_p99_ms")),
            "drift": finite(fig.get("drift")),
            "server": server,
            "prompt_tokens": ptok,
            "client": {"cpu_s": records.client_cpu_s, "loop_lag_max_ms": records.loop_lag_max_ms},
            "client_threads": int(records.client_threads),
            # client processes (--ray --shards), each with client_threads loops
            "shards": int(records.shards),
        }
    )
    return dict(fig)
