"""A cell's verdict: its figures, status, flags, reasons and server view, from its records.

Pure: no I/O, no clock, no state. The live sweep and a saved run (``speedmatrix
recompute``) go through the same functions, so every stored cell can be rebuilt from
its raw records, the engine facts that matter (`EngineFacts`) and the rules (`Rules`).

Inputs of a cell's verdict (all of them; nothing else is read):

* ``shape``: what the plan said about the cell (id, phase, context, label,
  concurrency, repetition): `CellShape` or anything with those attributes
  (`speedmatrix.plan.PlannedCell`);
* ``records``: `speedmatrix.records.Records` (requests, events, metrics and the
  cell's clock stamps);
* ``facts``: `EngineFacts` (whether the output length is forced, the metric names);
* ``rules``: `Rules` (the thresholds; defaults are today's);
* ``idle``: whether the server was seen idle before the cell (else ``busy_at_start``).

Figures come from `_core.summarize_cell` (C++): this module adds the statuses and flags
that DESIGN.md "Status" defines on top of them.

Over 500 lines: every status and flag rule with its helpers is kept in this one file, so
that the whole judgement of a cell can be read (and changed) in one place.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import numpy as np

from speedmatrix.records import Records

__all__ = [
    "CellShape",
    "EngineFacts",
    "Rules",
    "base_cell",
    "decode_cell",
    "error_text",
    "prefill_cell",
    "prompt_failure_cell",
    "server_view",
    "tokens_estimated",
    "unrun_cell",
]

# An error message kept per error kind in a cell (`error_examples`) is cut to this
# many characters: enough to say why, never a request body.
ERROR_EXAMPLE_CHARS = 300
# outcome codes of the request records (cpp/include/speedmatrix/records.hpp)
_OK = 1
_ERROR = 3


@dataclass(frozen=True)
class Rules:
    """The thresholds of the status and flag rules (DESIGN.md "Status")."""

    #: a cell is `queued` when, once its first wave of N requests was admitted, on
    #: average at least this many requests waited: the server's waiting count when it
    #: has metrics, else requests in flight without streaming (client side)
    queue_gap_requests: float = 0.5
    #: the client is the bottleneck (`client_bound`) when its thread used this share of a core
    client_bound_cpu_share: float = 0.85
    #: runs saved before steady-state windows (no ramp_start_ns): a first wave that took
    #: more than this share of the window to stream (or never all streamed) is flagged
    #: `long_ramp`. Newer runs are flagged when the ramp cap opened the window.
    ramp_share: float = 0.2
    #: a cell's median TTFT counts only the requests that got a first token; when more
    #: than this share of the requests sent in the window were still waiting at its end,
    #: longer than that median, the median reads low: `ttft_unserved`
    ttft_unserved_share: float = 0.05
    #: a cell is `error` when more than this share of its started requests failed
    error_threshold: float = 0.05
    #: `server_running_mismatch` when the server's mean running count exceeds
    #: N x factor + slack (another client is using the server)
    running_mismatch_factor: float = 1.1
    running_mismatch_slack: float = 0.5

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Rules:
        """Rules from a saved dict; unknown keys are ignored, missing ones take defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (data or {}).items() if k in names})

    def replace(self, **changes: Any) -> Rules:
        """These rules with some thresholds changed; unknown names raise KeyError."""
        names = {f.name for f in fields(self)}
        bad = sorted(set(changes) - names)
        if bad:
            raise KeyError(f"no rule {bad[0]!r} (rules: {', '.join(sorted(names))})")
        return Rules(**{**asdict(self), **{k: float(v) for k, v in changes.items()}})


@dataclass(frozen=True)
class EngineFacts:
    """What the verdict needs to know about the server, saved in run.json meta["verdict"]."""

    #: the engine generates exactly max_tokens (else `output_not_forced`)
    output_forced: bool = True
    #: Prometheus gauge names: running and waiting requests, KV usage (None = not exposed)
    metric_running: str | None = None
    metric_waiting: str | None = None
    metric_kv_usage: str | None = None
    #: the engine's preemption counter (speedmatrix.verdict_preemption)
    metric_preemptions: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EngineFacts:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})

    @classmethod
    def of_target(cls, target: Any) -> EngineFacts:
        """The facts of a discovered `speedmatrix.adapters.Target`."""
        m = target.metrics
        has = m is not None and m.available
        return cls(
            output_forced=bool(target.output.forced),
            metric_running=m.running if has else None,
            metric_waiting=m.waiting if has else None,
            metric_kv_usage=m.kv_usage if has else None,
            metric_preemptions=getattr(m, "preemptions", None) if has else None,
        )

    def metric_names(self) -> list[str]:
        names = (self.metric_running, self.metric_waiting, self.metric_kv_usage)
        return [n for n in (*names, self.metric_preemptions) if n]


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
            "status": "error",
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
        if req["outcome"][i] == _ERROR:
            kind = req["error_kind"][i] or "unknown"
            errors[kind] = errors.get(kind, 0) + 1
        elif req["first_token_ns"][i] > 0:
            ttfts.append((req["first_token_ns"][i] - req["sent_ns"][i]) / 1e6)
        if req["prompt_tokens"][i] >= 0:
            reported.append(int(req["prompt_tokens"][i]))
    ttft = float(np.median(ttfts)) if ttfts else None
    base.update(
        {
            "status": "valid" if ttft is not None else "error",
            "prompt_tok_s": shape.context / (ttft / 1000.0) if ttft else None,
            "ttft_ms": ttft,
            "completed": len(ttfts),
            "errors": errors,
            "error_examples": _error_examples(req, rows),
            "errors_total": sum(errors.values()),
            "prompt_tokens": prompt_check(shape.context, reported),
            "flags": [] if idle else ["busy_at_start"],
        }
    )
    if base["prompt_tokens"]["exact"] is False:
        base["flags"].append("prompt_mismatch")
    if measured_in:
        base["measured_in"] = measured_in
    if fatal := records.fatal_error:
        base["reason"] = fatal
    if ttft is None and not base.get("reason"):
        base["reason"] = "no first token: " + error_text(errors, base["error_examples"])
    return base


def prefill_rows(records: Records, from_warmup: bool) -> np.ndarray:
    """The request rows a prefill figure is taken from."""
    phase = records.requests["phase"]
    if from_warmup:
        # the first warm-up prompt; when its first try failed or timed out and was
        # sent again (warmup_retried), the try that answered
        first = np.flatnonzero((phase == 0) & (records.requests["body"] == 0))
        ok = first[records.requests["outcome"][first] == 1]
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
) -> dict:
    """A decode cell: figures of its window, its status and flags; with its latency
    distributions (`percentiles`), SLO attainment and goodput (`slo_targets`, ms) and, for
    a request-rate cell, what the open loop did (`speedmatrix.slo.cell_figures`)."""
    from speedmatrix._native import _core

    base = base_cell(shape)
    req, ev = records.requests, records.events
    t0, t1 = int(records.window_start_ns), int(records.window_end_ns)
    window = req["phase"] == 1
    errors: dict[str, int] = {}
    for kind, outcome in zip(
        np.asarray(req["error_kind"], dtype=object)[window], req["outcome"][window]
    ):
        if outcome == _ERROR:
            errors[kind or "unknown"] = errors.get(kind or "unknown", 0) + 1
    flags: list[str] = [] if idle else ["busy_at_start"]
    if not facts.output_forced:
        # the engine may stop a request early at end-of-sequence (TGI, Ollama,
        # generic servers): output lengths, and so the KV load, are not the asked ones
        flags.append("output_not_forced")
    if t0 <= 0 or t1 <= t0:
        # the window never started: the warm-up's failures say why
        errors = errors or _error_counts(req, np.flatnonzero(req["phase"] == 0))
        examples = _error_examples(req, np.flatnonzero(req["outcome"] == _ERROR))
        never = records.fatal_error or "the window never started (every warm-up request failed)" + (
            f": {error_text(errors, examples)}" if errors else ""
        )
        base.update(
            {
                "status": "error",
                "errors": errors,
                "error_examples": examples,
                "errors_total": sum(errors.values()),
                "reason": never,
                "flags": flags,
            }
        )
        return base

    rate = getattr(shape, "rate_per_s", None)
    open_loop = rate is not None
    # A steady-state window (DESIGN.md "Window") opens once the first wave streams:
    # t0 is the settle point and TTFT counts from the ramp's start (the first wave and
    # every refill). Runs saved before it (no ramp_start_ns) opened at the send. An
    # open-loop cell has no first wave: its window is its arrivals'.
    steady = not open_loop and int(records.ramp_start_ns) > 0
    ramp = int(records.ramp_start_ns) if steady else t0
    settle = t0 if (open_loop or steady) else first_wave_settled(req, shape.concurrency, t0, t1)
    fig = _core.summarize_cell(req, ev, t0, t1, 1.0, settle, ramp)
    server = server_view(records.metrics, facts, t0, t1, settle)
    reported = [int(x) for x in req["prompt_tokens"][window] if x >= 0]
    ptok = prompt_check(shape.context, reported)
    if getattr(shape, "prompts_file", ""):
        # a workload file's prompts have their own lengths: the server's counts are kept
        # per request in the records, and the range here; nothing was asked to compare
        ptok.update(asked=None, exact=None)
    base.update(
        {
            "total_tok_s": _finite(fig["total_tok_s"]),
            "per_request_tok_s": _finite(fig["per_request_tok_s"]),
            "decode_tok_s_per_request": _finite(fig.get("decode_tok_s_per_request")),
            "decode_requests": int(fig.get("decode_requests", 0)),
            "ttft_ms": _finite(fig["ttft_ms"]),
            "ttft_first_wave_ms": _finite(fig.get("ttft_first_wave_ms")),
            "tbt_ms": _finite(fig["tbt_ms"]),
            "avg_active": _finite(fig["avg_active"]),
            "completed": int(fig["completed"]),
            "output_tokens": int(fig["output_tokens"]),
            "measured_s": _finite(fig["measured_s"]) or 0.0,
            "started": int(fig["started"]),
            "errors": errors,
            "error_examples": _error_examples(
                req, np.flatnonzero(window & (req["outcome"] == _ERROR))
            ),
            "errors_total": sum(errors.values()),
            # re-sent on a new connection after a kept-alive one died before any byte of
            # the answer (a keep-alive close racing the request): counted apart, not errors
            "retried": int(np.count_nonzero(req["retries"][window])) if "retries" in req else 0,
            "t0_ns": t0,
            "t1_ns": t1,
            "ramp_start_ns": int(records.ramp_start_ns),
            "ramp_capped": bool(records.ramp_capped),
            "warmup_start_ns": int(records.warmup_start_ns),
            "end_ns": int(records.end_ns),
            "ci": {
                k: _interval(fig.get(f"{k}_ci"))
                for k in (
                    "total_tok_s",
                    "per_request_tok_s",
                    "decode_tok_s_per_request",
                    "ttft_ms",
                    "tbt_ms",
                )
            },
            # the larger relative half-width of the total tok/s and TBT intervals
            "precision": _finite(fig.get("precision")),
            "stopped_by": records.stopped_by or None,
            "stalls": int(errors.get("stall", 0)),
            # slot waits the core imposed after a 429 (errors.http_429) or a failed
            # connection, and the slot time they took in the window (closed loop)
            "backoffs": int(records.backoffs),
            "backoff_s": _finite(float(records.backoff_s)) or 0.0,
            # slot time the failed streams held silent in the window (a stall's wait)
            "error_slot_s": _finite(fig.get("error_slot_s")),
            "warmup_retried": int(records.warmup_retried),
            "ttft_p90_ms": _finite(fig.get("ttft_p90_ms")),
            "ttft_p99_ms": _finite(fig.get("ttft_p99_ms")),
            "tbt_p90_ms": _finite(fig.get("tbt_p90_ms")),
            "tbt_p99_ms": _finite(fig.get("tbt_p99_ms")),
            "drift": _finite(fig.get("drift")),
            "server": server,
            "prompt_tokens": ptok,
            "client": {"cpu_s": records.client_cpu_s, "loop_lag_max_ms": records.loop_lag_max_ms},
        }
    )
    if fig.get("drifting"):
        flags.append("drift")
    if ptok["exact"] is False:
        flags.append("prompt_mismatch")
    if tokens_estimated(req["token_source"][window], req["outcome"][window]):
        flags.append("estimated_tokens")
    # client CPU covers the whole cell, warm-up included
    cell_s = (int(records.end_ns) - int(records.warmup_start_ns)) / 1e9
    if cell_s > 0 and records.client_cpu_s > rules.client_bound_cpu_share * cell_s:
        flags.append("client_bound")
    if (
        server
        and server.get("running_mean") is not None
        and (not open_loop or shape.concurrency > 0)
        and server["running_mean"]
        > shape.concurrency * rules.running_mismatch_factor + rules.running_mismatch_slack
    ):
        flags.append("server_running_mismatch")
    unserved, unserved_longer = ttft_unserved(req, ramp, t1, base["ttft_ms"])
    base["ttft_unserved"] = unserved
    # every window request sent from the ramp's start: the first wave and its refills
    sent_rows = window & (req["sent_ns"] >= ramp) & (req["sent_ns"] <= t1)
    started = max(int(np.count_nonzero(sent_rows)), 1)
    if unserved_longer and unserved_longer > rules.ttft_unserved_share * started:
        flags.append("ttft_unserved")
    if base["stalls"]:
        flags.append("stalls")
    if errors.get("http_429"):
        flags.append("rate_limited")
    base["flags"] = flags

    from speedmatrix import latency, slo

    extra = slo.cell_figures(
        req,
        ev,
        t0,
        t1,
        rate_per_s=rate,
        percentiles=tuple(percentiles or latency.DEFAULT_PERCENTILES),
        slo=slo_targets or None,
    )
    extra["latency"]["percentiles"] = [float(p) for p in percentiles or latency.DEFAULT_PERCENTILES]
    base.update(extra)
    queued_client = client_queue_signal(req, settle, t1)
    if open_loop:
        ol = base["open_loop"]
        started = max(int(ol["arrivals"]), 1)  # failures count against the arrivals
        if not ol["kept_up"]:
            flags.append("behind")
    else:
        base["ramp_s"] = (settle - ramp) / 1e9 if steady else (settle - t0) / 1e9
        streamed = first_wave_streamed(req, shape.concurrency)
        base["first_wave_streamed"] = streamed
        if steady:
            if records.ramp_capped:
                flags.append("long_ramp")
        elif streamed < shape.concurrency or settle - t0 > rules.ramp_share * (t1 - t0):
            flags.append("long_ramp")
    base["waiting_without_tokens"] = queued_client
    status = "valid"
    reason: str | None = None
    if records.stopped_by == "unreachable":
        # the core ended the window: connections kept failing (its one line says how)
        status = "error"
        reason = records.stop_reason or "the server stopped accepting connections"
    elif base["errors_total"] > rules.error_threshold * started or base["output_tokens"] == 0:
        status = "error"
        reason = (
            (
                f"{base['errors_total']} of {started} requests failed: "
                + error_text(errors, base["error_examples"])
            )
            if errors
            else "no output tokens in the window"
        )
    elif server and (server.get("waiting_held_mean") or 0) >= rules.queue_gap_requests:
        status = "queued"
        reason = (
            f"the server kept {server['waiting_held_mean']:.1f} requests waiting on "
            f"average (up to {server['waiting_max']:g}) once the first wave was "
            "admitted, while it ran no more than before"
        )
    elif (
        not server or server.get("waiting_held_mean") is None
    ) and queued_client > rules.queue_gap_requests:
        # No waiting count from the server (no metrics, or metrics without a waiting
        # gauge): the client's view decides.
        status = "queued"
        why = "no server metrics" if not server else "the server reports no waiting count"
        reason = f"on average {queued_client:.1f} requests were in flight without streaming ({why})"
    base["status"] = status
    if reason:
        base["reason"] = reason
    from speedmatrix import verdict_preemption as vp

    vp.apply_preemptions(
        base,
        vp.preemptions_in(records.metrics, facts.metric_preemptions),
        vp.capacity_check_of(shape),
        vp.waited_for_kv(records.metrics, facts, getattr(shape, "kv_admit_share", 0.0)),
        getattr(shape, "kv_admit_share", 0.0),
    )
    vp.apply_refusal(base)
    return base


def server_view(metrics: dict, facts: EngineFacts, t0: int, t1: int, settle: int) -> dict | None:
    """What the server's own gauges said over the window [t0, t1]: mean and peak running,
    peak waiting, the waiting it held once the first wave settled, peak KV usage."""
    names = list(metrics.get("names", []))
    if not names or len(metrics["t_ns"]) == 0:
        return None
    t = np.asarray(metrics["t_ns"])
    vals = np.asarray(metrics["values"], dtype=float).reshape(len(t), len(names))
    inside = (t >= t0) & (t <= t1)
    if not inside.any():
        return None
    out: dict = {"samples": int(inside.sum()), "poll_failures": int(metrics.get("failures", 0))}

    def col(name):
        if name and name in names:
            v = vals[inside, names.index(name)]
            v = v[np.isfinite(v)]
            return v if len(v) else None
        return None

    m_run, m_wait, m_kv = facts.metric_running, facts.metric_waiting, facts.metric_kv_usage
    running, waiting, kv = col(m_run), col(m_wait), col(m_kv)
    out["running_mean"] = float(running.mean()) if running is not None else None
    out["running_max"] = float(running.max()) if running is not None else None
    out["waiting_max"] = float(waiting.max()) if waiting is not None else None
    out["waiting_mean_settled"] = None
    out["waiting_held_mean"] = None
    if m_wait and m_wait in names:
        w_all = vals[:, names.index(m_wait)]
        r_all = vals[:, names.index(m_run)] if m_run in names else None
        # A burst of N arrivals queues briefly on any server while the first
        # wave is admitted; a server that cannot run N at once keeps some
        # waiting after that. Judge from the samples after the first wave
        # settled (or the window's second half if it never did).
        after = (t >= max(settle, t0)) & (t <= t1)
        if after.sum() < 2 or settle >= t1:
            after = (t >= t0 + (t1 - t0) // 2) & (t <= t1)
        w = w_all[after]
        out["waiting_mean_settled"] = float(np.nanmean(w)) if np.isfinite(w).any() else None
        out["waiting_held_mean"] = held_waiting(w_all, r_all, inside, after)
    out["kv_usage_max"] = float(kv.max()) if kv is not None else None
    if all(out[k] is None for k in ("running_mean", "waiting_max", "kv_usage_max")):
        return None
    return out


# ------------------------------------------------------------------------------ helpers
def tokens_estimated(token_source: np.ndarray, outcome: np.ndarray) -> bool:
    """Whether the cell's output counts rest on per-chunk estimates (token_source 1).

    Only completed requests count: an engine that sends usage in its final chunk (llama.cpp)
    has none for the requests the window's end cut, and those few are counted per chunk
    although every completed request had exact usage. With no completed request, any
    per-chunk count flags the cell."""
    sources = np.asarray(token_source)
    if not len(sources):
        return False
    completed = np.asarray(outcome) == _OK
    if completed.any():
        return bool(np.any(sources[completed] == 1))
    return bool(np.any(sources == 1))


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _interval(ci: Any) -> list[float | None] | None:
    if not ci:
        return None
    lo, hi = _finite(ci[0]), _finite(ci[1])
    return None if lo is None or hi is None else [lo, hi]


def _error_counts(req: dict, rows) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in rows:
        if req["outcome"][i] == _ERROR:
            kind = req["error_kind"][i] or "unknown"
            out[kind] = out.get(kind, 0) + 1
    return out


def _error_examples(req: dict, rows) -> dict[str, str]:
    """The first error message of each kind among `rows` (failed requests), cut to
    ERROR_EXAMPLE_CHARS: what the transport or the server said, never a request body."""
    out: dict[str, str] = {}
    messages = req.get("error_message")
    for i in rows:
        if req["outcome"][i] != _ERROR:
            continue
        kind = req["error_kind"][i] or "unknown"
        if kind not in out:
            text = str(messages[i]) if messages is not None else ""
            out[kind] = text[:ERROR_EXAMPLE_CHARS]
    return out


def error_text(errors: dict[str, int], examples: dict[str, str]) -> str:
    """ "http_500 x4, connect x1" and the first message of the most frequent kind."""
    text = ", ".join(f"{k} x{v}" for k, v in sorted(errors.items()))
    if errors:
        top = max(sorted(errors), key=lambda k: errors[k])
        if examples.get(top):
            text += f" ({top}: {examples[top]})"
    return text


def prompt_check(asked: int, reported: list[int]) -> dict:
    """The prompt-token check: what was asked and the range the server reported."""
    if not reported:
        return {"asked": int(asked), "reported_min": None, "reported_max": None, "exact": None}
    lo, hi = min(reported), max(reported)
    return {
        "asked": int(asked),
        "reported_min": lo,
        "reported_max": hi,
        "exact": bool(lo == asked and hi == asked),
    }


def first_wave_settled(req: dict, n: int, t0: int, t1: int) -> int:
    """When the window's first N requests had all received their first token;
    the latest first token among them when some never did (those then count as
    waiting for the rest of the window); t1 when none streamed."""
    rows = np.flatnonzero(req["phase"] == 1)[:n]
    first = req["first_token_ns"][rows].astype(np.int64)
    got = first[first > 0]
    if len(got) == 0:
        return t1
    return int(min(max(got.max(), t0), t1))


def first_wave_streamed(req: dict, n: int) -> int:
    """How many of the window's first N requests received a first token."""
    rows = np.flatnonzero(req["phase"] == 1)[:n]
    return int(np.count_nonzero(req["first_token_ns"][rows] > 0))


def ttft_unserved(req: dict, t0: int, t1: int, ttft_ms: float | None) -> tuple[int, int]:
    """Window requests sent in [t0, t1] that had no first token by t1 and did not fail:
    (all of them, those that waited longer than `ttft_ms`). The second are requests
    whose TTFT is known to exceed the median that leaves them out."""
    sent = req["sent_ns"]
    first = req["first_token_ns"]
    rows = np.flatnonzero(
        (req["phase"] == 1) & (sent >= t0) & (sent <= t1) & (req["outcome"] != _ERROR)
    )
    unserved = rows[(first[rows] < 0) | (first[rows] > t1)]
    if ttft_ms is None:
        return len(unserved), len(unserved)
    longer = np.count_nonzero((t1 - sent[unserved]) / 1e6 > ttft_ms)
    return len(unserved), int(longer)


def held_waiting(
    waiting: np.ndarray, running: np.ndarray | None, inside: np.ndarray, judged: np.ndarray
) -> float | None:
    """Mean over the `judged` samples of the requests the server kept waiting.

    A sample's waiting requests count as held when the server was not admitting:
    its running count was no higher than at an earlier sample of the window (a
    server still taking in the first wave reaches a new high at every sample,
    and the request it is about to admit shows as waiting for a moment). A held
    sample counts only next to another held one: a server that cannot run N at
    once keeps requests waiting from sample to sample, while a request handed to
    the scheduler between two steps is seen once at most."""
    idx = np.flatnonzero(inside)
    if len(idx) == 0 or not judged.any():
        return None
    w = np.nan_to_num(waiting[idx], nan=0.0)
    held = w > 0
    if running is not None:
        r = running[idx]
        prior_max = np.maximum.accumulate(np.where(np.isfinite(r), r, -np.inf))
        prior_max = np.concatenate(([-np.inf], prior_max[:-1]))
        held &= ~(np.isfinite(r) & (r > prior_max))
    pair = np.zeros_like(held)
    pair[1:] |= held[1:] & held[:-1]
    pair[:-1] |= held[:-1] & held[1:]
    sel = judged[idx]
    return float(np.mean(np.where(pair, w, 0.0)[sel])) if sel.any() else None


def client_queue_signal(req: dict, start: int, t1: int) -> float:
    """Time-weighted mean number of window requests that were in flight but not
    streaming, over [start, t1] (start = when the first wave settled). A server
    that runs every request at once streams all of them; one that queues holds
    some without tokens for long stretches."""
    window = req["phase"] == 1
    sent = req["sent_ns"][window].astype(np.int64)
    first = req["first_token_ns"][window].astype(np.int64)
    done = req["done_ns"][window].astype(np.int64)
    if len(sent) == 0 or start >= t1:
        return 0.0
    end = np.where(done > 0, done, t1)
    wait_end = np.where(first > 0, np.minimum(first, end), end)
    a = np.clip(sent, start, t1)
    b = np.clip(wait_end, start, t1)
    return float(np.sum(np.maximum(b - a, 0)) / (t1 - start))
