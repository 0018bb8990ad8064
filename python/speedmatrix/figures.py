"""The catalogue of figures: every column of ``Run.cells`` named once.

Each entry says the figure's unit, a one-line definition, which records it reads, how it is
summarized, and who computes it (``core``: ``_core.summarize_cell`` / ``token_arrivals``, C++;
``python``: a named module). ``run.cells`` columns, the report's labels (`label`) and
docs/metrics.md's figures table (`markdown_table`) are checked against or generated from it
(tests/python/test_figures.py). A figure has one derivation: where two sets of requests give
two different figures of one kind (TTFT of the requests sent in the window vs of those that
completed in it) they carry two names.

Families of columns are entries with placeholders: ``{p}`` a percentile (``50``, ``99.9``:
the run's ``--percentiles``), ``{fig}`` a figure with a confidence interval.

This module also holds the confidence level every interval uses, and its quantiles, read
from the core (one definition, cpp/include/speedmatrix/stats.hpp).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from speedmatrix._native import _core

__all__ = [
    "CATALOGUE",
    "CI_FIGURES",
    "CONFIDENCE",
    "DEFAULT_PERCENTILES",
    "DISTRIBUTION_PREFIX",
    "GROUPS",
    "OPTIONAL_GROUPS",
    "RENAMED",
    "Z_TWO_SIDED",
    "Figure",
    "find",
    "label",
    "markdown_table",
    "t_quantile",
    "tbt_levels",
]

#: the confidence level of every interval (cpp stats.hpp kConfidence)
CONFIDENCE: float = float(_core.CONFIDENCE)
#: its two-sided normal quantile (cpp stats.hpp kZ975)
Z_TWO_SIDED: float = float(_core.Z_TWO_SIDED)


#: the percentiles (the ``{p}`` of the distributions' columns) a run gives unless told
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)


def tbt_levels(percentiles: tuple[float, ...] | list[float]) -> list[float]:
    """The quantiles (in [0, 1]: ``tbt_qs``) of `_core.summarize_cell` whose tbt_quantiles_ms
    the TBT distribution of these percentiles reads: the median and each one, ascending."""
    return [p / 100 for p in sorted({50.0, *percentiles})]


def t_quantile(df: int) -> float:
    """Two-sided Student t quantile at `CONFIDENCE` (the core's, `_core.t_quantile`)."""
    return float(_core.t_quantile(int(df))) if df >= 1 else math.nan


@dataclass(frozen=True)
class Figure:
    name: str  #: the run.cells column (placeholders ``{p}``, ``{fig}`` for families)
    unit: str  #: ``tok/s``, ``ms``, ``s``, ``requests``, ``tokens``, ``share``, ``ns``, ``""``
    label: str  #: what the report and notebooks call it
    definition: str  #: one line
    reads: str  #: which records: requests, events (token arrivals), metrics, run, cell
    summary: str  #: median, percentile, mean, rate, count, share, max, value, interval
    by: str  #: ``core`` (C++) or the Python module that computes it
    group: str  #: one of GROUPS (run.cells drops a group a run did not measure)


#: groups of columns, in display order
GROUPS = (
    "cell",
    "throughput",
    "latency",
    "window",
    "interval",
    "distribution",
    "prefill",
    "server",
    "client",
    "open_loop",
    "slo",
    "prefix_cache",
    "interference",
    "trace",
    "sessions",
    "predicted",
    "reasoning",
)

#: groups of what a run may not have measured: `Run.cells` drops their columns that are
#: empty in every cell (`Run.all_cells` keeps them)
OPTIONAL_GROUPS = (
    "distribution",
    "open_loop",
    "slo",
    "prefix_cache",
    "interference",
    "trace",
    "sessions",
    "predicted",
    "reasoning",
)

_V = "verdict"
_L = "latency"
_S = "slo"
_R = "reasoning"


def _f(*a: str) -> Figure:
    return Figure(*a)


# One line per figure reads as a table; the formatter would give each field a line.
# fmt: off
_ENTRIES: tuple[Figure, ...] = (
    # --- identity and judgement of a cell ---
    _f("id", "", "Cell", "phase-context-concurrency-repetition", "cell", "value", _V, "cell"),
    _f("phase", "", "Phase", "decode, prefill, interference or session", "cell", "value", _V, "cell"),
    _f("context", "tokens", "Context", "prompt tokens per request asked", "cell", "value", _V, "cell"),
    _f("label", "", "Context", "the context as the matrix wrote it", "cell", "value", _V, "cell"),
    _f("concurrency", "requests", "Concurrency", "requests kept in flight (closed loop)", "cell", "value", _V, "cell"),
    _f("repetition", "", "Repetition", "index of the repetition of this cell", "cell", "value", _V, "cell"),
    _f("status", "", "Status", "valid, queued, over_capacity or error", "requests, metrics", "value", _V, "cell"),
    _f("reason", "", "Reason", "why the cell has its status (one line)", "requests, metrics", "value", _V, "cell"),
    _f("flags", "", "Flags", "what may make the figures misleading (docs/metrics.md)", "requests, events, metrics", "value", _V, "cell"),
    _f("measured_in", "", "Measured in", "the decode cell whose warm-up measured this prefill cell", "cell", "value", _V, "cell"),
    _f("records", "", "Records", "file of the cell's raw records in the run folder", "cell", "value", _V, "cell"),
    _f("prompts_file", "", "Prompts file", "the workload file the prompts came from", "cell", "value", _V, "cell"),
    _f("rate_per_s", "requests/s", "Request rate", "arrival rate asked (open loop)", "cell", "value", _V, "cell"),
    _f("arrival", "", "Arrivals", "arrival process (open loop): poisson, constant, gamma", "cell", "value", _V, "cell"),
    # --- predicted cells (the twin: nothing measured) ---
    _f("predicted", "", "Predicted", "the twin predicted this cell from an engine profile; nothing in it was measured", "run", "value", "twin/predictrun", "predicted"),
    _f("total_tok_s_low", "tok/s", "Total tok/s low", "predicted cell: low end of total_tok_s's prediction interval", "run", "interval", "twin/model", "predicted"),
    _f("total_tok_s_high", "tok/s", "Total tok/s high", "predicted cell: high end of total_tok_s's prediction interval", "run", "interval", "twin/model", "predicted"),
    _f("tbt_ms_low", "ms", "TBT low", "predicted cell: low end of tbt_ms's prediction interval", "run", "interval", "twin/model", "predicted"),
    _f("tbt_ms_high", "ms", "TBT high", "predicted cell: high end of tbt_ms's prediction interval", "run", "interval", "twin/model", "predicted"),
    # --- throughput ---
    _f("total_tok_s", "tok/s", "Total tok/s", "output tokens that arrived in the window / its length", "events", "rate", "core", "throughput"),
    _f("per_request_tok_s", "tok/s", "Per-request tok/s", "1000 / tbt_ms (the seed's definition)", "events", "median", "core", "throughput"),
    _f("decode_tok_s_per_request", "tok/s", "Decode tok/s per request", "median over requests of tokens after their first window arrival / the time to their last", "events", "median", "core", "throughput"),
    _f("decode_requests", "requests", "Decode requests", "requests decode_tok_s_per_request is the median of", "events", "count", "core", "throughput"),
    _f("output_tokens", "tokens", "Output tokens", "tokens that arrived in the window", "events", "count", "core", "throughput"),
    _f("avg_active", "requests", "Average active", "time-weighted mean of window requests in flight over the window", "requests", "mean", "core", "throughput"),
    _f("prompt_tok_s", "tok/s", "Prompt tok/s", "prefill: context / the median cold TTFT", "requests", "rate", _V, "prefill"),
    # --- latency headline figures ---
    _f("ttft_ms", "ms", "TTFT", "median first token - send over window requests sent from the ramp's start (prefill: the cold TTFT)", "requests", "median", "core", "latency"),
    _f("ttft_p90_ms", "ms", "TTFT p90", "90th percentile of the TTFTs ttft_ms is the median of", "requests", "percentile", "core", "latency"),
    _f("ttft_p99_ms", "ms", "TTFT p99", "99th percentile of the TTFTs ttft_ms is the median of", "requests", "percentile", "core", "latency"),
    _f("ttft_first_wave_ms", "ms", "TTFT first wave", "median TTFT of the first window request of each slot", "requests", "median", "core", "latency"),
    _f("tbt_ms", "ms", "Time between tokens", "median gap between a window request's token deliveries (a read, or reads < 1 ms after its first), spread over the delivery's tokens (failed requests excluded)", "events", "median", "core", "latency"),
    _f("tbt_p90_ms", "ms", "TBT p90", "90th percentile of the gaps tbt_ms is the median of", "events", "percentile", "core", "latency"),
    _f("tbt_p99_ms", "ms", "TBT p99", "99th percentile of the gaps tbt_ms is the median of", "events", "percentile", "core", "latency"),
    _f("ttfb_ms", "ms", "TTFB", "median first response byte - send over the requests ttft_ms reads", "requests", "median", _R, "latency"),
    _f("ttfo_ms", "ms", "TTFO", "median first content token (not reasoning) - send over the requests ttft_ms reads", "requests", "median", _R, "latency"),
    _f("coalesced_share", "share", "Coalesced delivery", "share of the window's token events that came with another in one delivery of their stream", "events", "share", "core", "latency"),
    # --- the window ---
    _f("measured_s", "s", "Window", "length of the measured window t1 - t0", "cell", "value", "core", "window"),
    _f("completed", "requests", "Completed", "window requests that finished OK inside the window", "requests", "count", "core", "window"),
    _f("started", "requests", "Started", "window requests sent inside the window", "requests", "count", "core", "window"),
    _f("errors", "requests", "Errors", "failed window requests by kind", "requests", "count", _V, "window"),
    _f("error_examples", "", "Error examples", "one message per error kind (redacted)", "requests", "value", _V, "window"),
    _f("errors_total", "requests", "Errors", "failed window requests", "requests", "count", _V, "window"),
    _f("error_slot_s", "s", "Error slot time", "slot time failed streams held silent in the window", "events, requests", "rate", "core", "window"),
    _f("retried", "requests", "Retried", "window requests re-sent after a kept-alive connection died before any byte", "requests", "count", _V, "window"),
    _f("stalls", "requests", "Stalls", "streams cut for going silent (errors.stall)", "requests", "count", _V, "window"),
    _f("backoffs", "", "Backoffs", "slot waits after a 429 or a failed connection", "cell", "count", _V, "window"),
    _f("backoff_s", "s", "Backoff time", "slot time those waits took in the window", "cell", "value", _V, "window"),
    _f("stopped_by", "", "Stopped by", "what ended the window (duration, precision, unreachable)", "cell", "value", _V, "window"),
    _f("precision", "share", "Precision", "larger relative half-width of the total tok/s and tbt_ms intervals", "events", "value", "core", "window"),
    _f("drift", "share", "Drift", "relative change of per-bin throughput across the steady window (least squares)", "events", "value", "core", "window"),
    _f("warmup_retried", "", "Warm-up retried", "warm-up requests sent again", "cell", "count", _V, "window"),
    _f("ramp_s", "s", "Ramp", "from the ramp's start to the steady window's start", "requests", "value", _V, "window"),
    _f("ramp_capped", "", "Ramp capped", "the ramp cap opened the window before steady state", "cell", "value", _V, "window"),
    _f("first_wave_streamed", "requests", "First wave streamed", "slots whose first request streamed a token", "requests", "count", _V, "window"),
    _f("waiting_without_tokens", "requests", "Waiting without tokens", "mean window requests in flight without a first token", "requests", "mean", _V, "window"),
    _f("ttft_unserved", "requests", "Unserved", "requests sent in the window still without a first token at its end", "requests", "count", _V, "window"),
    _f("t0_ns", "ns", "Window start", "window start (monotonic clock)", "cell", "value", _V, "window"),
    _f("t1_ns", "ns", "Window end", "window end (monotonic clock)", "cell", "value", _V, "window"),
    _f("ramp_start_ns", "ns", "Ramp start", "first request of the first wave sent", "cell", "value", _V, "window"),
    _f("warmup_start_ns", "ns", "Warm-up start", "warm-up start", "cell", "value", _V, "window"),
    _f("end_ns", "ns", "End", "cell end", "cell", "value", _V, "window"),
    # --- prompt tokens ---
    _f("prompt_tokens_asked", "tokens", "Prompt tokens asked", "prompt tokens the cell asked for", "cell", "value", _V, "cell"),
    _f("prompt_tokens_reported_min", "tokens", "Prompt tokens (min)", "smallest prompt count the server reported", "requests", "min", _V, "cell"),
    _f("prompt_tokens_reported_max", "tokens", "Prompt tokens (max)", "largest prompt count the server reported", "requests", "max", _V, "cell"),
    _f("prompt_tokens_exact", "", "Prompt exact", "every reported count equals the asked one", "requests", "value", _V, "cell"),
    _f("prompt_tokens_method", "", "Prompt method", "how prompts were made exact", "cell", "value", _V, "cell"),
    # --- intervals (CONFIDENCE) ---
    _f("{fig}_lo", "", "{fig} CI low", "low end of the 95% interval of {fig} (docs/metrics.md: intervals)", "events, requests", "interval", "core", "interval"),
    _f("{fig}_hi", "", "{fig} CI high", "high end of the 95% interval of {fig}", "events, requests", "interval", "core", "interval"),
    # --- latency distributions (latency.py; run.json's latency) ---
    _f("e2e_n", "requests", "E2E n", "requests completed in the window (the latency set)", "requests", "count", _L, "distribution"),
    _f("e2e_mean_ms", "ms", "E2E mean", "mean done - send over completed requests", "requests", "mean", _L, "distribution"),
    _f("e2e_p{p}_ms", "ms", "E2E p{p}", "percentile of done - send over completed requests", "requests", "percentile", _L, "distribution"),
    _f("ttft_completed_n", "requests", "TTFT (completed) n", "completed requests with a first token", "requests", "count", _L, "distribution"),
    _f("ttft_completed_mean_ms", "ms", "TTFT (completed) mean", "mean TTFT over completed requests", "requests", "mean", _L, "distribution"),
    _f("ttft_completed_p{p}_ms", "ms", "TTFT (completed) p{p}", "percentile of TTFT over completed requests (ttft_ms: over requests sent)", "requests", "percentile", _L, "distribution"),
    _f("tpot_n", "requests", "TPOT n", "completed requests with two tokens or more", "requests", "count", _L, "distribution"),
    _f("tpot_mean_ms", "ms", "TPOT mean", "mean (e2e - ttft) / (output - 1) over completed requests", "requests", "mean", _L, "distribution"),
    _f("tpot_p{p}_ms", "ms", "TPOT p{p}", "percentile of (e2e - ttft) / (output - 1) over completed requests", "requests", "percentile", _L, "distribution"),
    _f("tbt_n", "tokens", "TBT n", "token gaps tbt_ms is the median of", "events", "count", _L, "distribution"),
    _f("tbt_mean_ms", "ms", "TBT mean", "mean of the gaps tbt_ms is the median of", "events", "mean", _L, "distribution"),
    _f("tbt_p{p}_ms", "ms", "TBT p{p}", "percentile of the gaps tbt_ms is the median of (p50 is tbt_ms)", "events", "percentile", _L, "distribution"),
    _f("e2e_sched_n", "requests", "E2E from schedule n", "open loop: completed arrivals", "requests", "count", _L, "open_loop"),
    _f("e2e_sched_mean_ms", "ms", "E2E from schedule mean", "open loop: mean done - scheduled", "requests", "mean", _L, "open_loop"),
    _f("e2e_sched_p{p}_ms", "ms", "E2E from schedule p{p}", "open loop: percentile of done - scheduled", "requests", "percentile", _L, "open_loop"),
    _f("ttft_sched_n", "requests", "TTFT from schedule n", "open loop: completed arrivals", "requests", "count", _L, "open_loop"),
    _f("ttft_sched_mean_ms", "ms", "TTFT from schedule mean", "open loop: mean first token - scheduled", "requests", "mean", _L, "open_loop"),
    _f("ttft_sched_p{p}_ms", "ms", "TTFT from schedule p{p}", "open loop: percentile of first token - scheduled", "requests", "percentile", _L, "open_loop"),
    _f("queue_n", "requests", "Queue n", "open loop: completed arrivals", "requests", "count", _L, "open_loop"),
    _f("queue_mean_ms", "ms", "Queue mean", "open loop: mean sent - scheduled", "requests", "mean", _L, "open_loop"),
    _f("queue_p{p}_ms", "ms", "Queue p{p}", "open loop: percentile of sent - scheduled over completed arrivals", "requests", "percentile", _L, "open_loop"),
    # --- the server's gauges (/metrics) ---
    _f("server_running_mean", "requests", "Server running (mean)", "mean of the server's running gauge over the window", "metrics", "mean", _V, "server"),
    _f("server_running_max", "requests", "Server running (max)", "peak of the running gauge", "metrics", "max", _V, "server"),
    _f("server_waiting_max", "requests", "Server waiting (max)", "peak of the waiting gauge", "metrics", "max", _V, "server"),
    _f("server_kv_usage_max", "share", "KV usage (max)", "peak KV cache usage", "metrics", "max", _V, "server"),
    _f("server_samples", "", "Metric samples", "/metrics scrapes in the window", "metrics", "count", _V, "server"),
    _f("server_poll_failures", "", "Metric failures", "/metrics scrapes that failed", "metrics", "count", _V, "server"),
    _f("server_waiting_mean_settled", "requests", "Server waiting (settled)", "mean waiting once the first wave settled", "metrics", "mean", _V, "server"),
    _f("server_waiting_held_mean", "requests", "Server waiting (held)", "mean waiting held while running did not grow", "metrics", "mean", _V, "server"),
    # --- the client ---
    _f("client_cpu_s", "s", "Client CPU", "CPU time of the client thread over the cell", "cell", "value", _V, "client"),
    _f("client_loop_lag_max_ms", "ms", "Client loop lag", "longest lateness of the client's event loop", "cell", "max", _V, "client"),
    _f("client_threads", "", "Client threads", "event loops the client ran the cell with (--client-threads)", "cell", "value", _V, "client"),
    _f("shards", "", "Client shards", "client processes the cell ran on (--ray --shards), each with client_threads loops; records pooled", "cell", "value", _V, "client"),
    _f("client_headroom", "×", "Client headroom", "the client's roofline on this host (speedmatrix selftest) over the window's token events/s and finished requests/s, the smaller ratio", "events", "value", _V, "client"),
    # --- open loop (latency.open_loop_figures; run.json's open_loop) ---
    # --- the prefix-cache axis (--cached-fraction) ---
    _f("cached_fraction", "share", "Cached fraction asked", "share of each prompt repeating a prefix the server has seen", "cell", "value", "prefixcache", "prefix_cache"),
    _f("delivered_cached_fraction", "share", "Cached fraction delivered", "prompt tokens the server served from its cache / prompt tokens (usage cached_tokens, else llama.cpp timings, else the server's counters)", "requests", "share", "prefixcache", "prefix_cache"),
    _f("delivered_cached_source", "", "Delivered from", "where delivered_cached_fraction was read: usage (the requests' cached_tokens) or counters", "requests, metrics", "value", "prefixcache", "prefix_cache"),
    _f("cache_counters_before", "", "Cache counters before", "the server's prefix-cache counters (summed over labels) read after the prefix warm-up, before the window", "metrics", "value", "prefixcache", "prefix_cache"),
    _f("cache_counters_after", "", "Cache counters after", "the same counters read after the window", "metrics", "value", "prefixcache", "prefix_cache"),
    # --- the prefill-interference cell (--interference EVERY) ---
    _f("interference_every_s", "s", "Prefill every", "seconds between the cold C-token prompts sent beside the N decoding streams", "cell", "value", _V, "interference"),
    _f("interference_streams", "requests", "Decoding streams", "decoding streams that reached their first token", "requests", "count", "interference", "interference"),
    _f("interference_prefills", "requests", "Prefills", "interfering prompts that reached their first token", "requests", "count", "interference", "interference"),
    _f("tbt_overlap_p99_ms", "ms", "TBT p99 during prefills", "p99 of the decoders' gaps (after all stream) that overlap a prefill's send-to-first-token window", "events, requests", "percentile", "interference", "interference"),
    _f("tbt_clear_p99_ms", "ms", "TBT p99 clear of prefills", "p99 of the decoders' gaps that overlap no prefill window", "events, requests", "percentile", "interference", "interference"),
    _f("tbt_inflation", "", "TBT inflation", "tbt_overlap_p99_ms / tbt_clear_p99_ms", "events, requests", "value", "interference", "interference"),
    _f("overlap_gaps", "", "Gaps during prefills", "decoder gaps that overlap a prefill window", "events, requests", "count", "interference", "interference"),
    _f("clear_gaps", "", "Gaps clear of prefills", "decoder gaps that overlap none", "events, requests", "count", "interference", "interference"),
    _f("gaps_over_100ms", "", "Gaps over 100 ms", "decoder gaps longer than 100 ms, during prefills or not", "events", "count", "interference", "interference"),
    # --- trace replay (--trace FILE --speedup K): lateness is queue_p{p}_ms ---
    _f("trace", "", "Trace", "the trace file replayed", "cell", "value", _V, "trace"),
    _f("speedup", "", "Speed-up", "the trace's arrival times were divided by this", "cell", "value", _V, "trace"),
    # --- multi-turn sessions (--sessions TURNS --turn-tokens --think-time) ---
    _f("sessions", "", "Turns", "turns of each session (concurrency: sessions at once; context: the first turn's prompt)", "cell", "value", _V, "sessions"),
    _f("turn_tokens", "tokens", "Turn tokens", "new user tokens each turn adds after the previous answer", "cell", "value", _V, "sessions"),
    _f("think_time_s", "s", "Think time", "seconds between a turn's end and the next turn", "cell", "value", _V, "sessions"),
    _f("session_answer_tokens", "tokens", "Answer cap", "the answers' cap (max_output): a stand-in answer's tokens", "cell", "value", _V, "sessions"),
    _f("session_ttft_ms_by_turn", "ms", "TTFT per turn", "per turn, median first token - send (a list)", "requests", "median", "sessions", "sessions"),
    _f("session_turn_prompt_tokens", "tokens", "Prompt per turn", "per turn, the median prompt tokens sent: the previous prompt + its answer + a new message (a list)", "requests", "median", "sessions", "sessions"),
    _f("session_turn_answer_tokens", "tokens", "Answer per turn", "per turn, the median tokens of its answers, the ids the next prompt carries (a list)", "requests", "median", "sessions", "sessions"),
    _f("session_turn_cached_tokens", "tokens", "Cached prefix per turn", "per turn, the median prompt tokens the server had seen: the previous turn's prompt and, unless a stand-in, its answer (a list)", "requests", "median", "sessions", "sessions"),
    _f("session_answer_source", "", "Answer source", "answers by where their ids came from: stream, tokenize, tokenizer or stand_in (counts)", "requests", "count", "sessions", "sessions"),
    _f("session_answer_reason", "", "Stand-in reason", "why the first stand-in answer was one (empty: none was)", "requests", "value", "sessions", "sessions"),
    _f("session_turn_delivered_cached_tokens", "tokens", "Cached per turn (server)", "per turn, the median cached prompt tokens the server reported in usage (a list; None where it did not say)", "requests", "median", "sessions", "sessions"),
    _f("session_tbt_ms", "ms", "Session TBT", "median gap between a request's token deliveries, every turn, a delivery of k tokens counted k times", "events", "median", "sessions", "sessions"),
    _f("session_turns_completed", "requests", "Turns completed", "turns that completed, every session", "requests", "count", "sessions", "sessions"),
    _f("session_duration_s", "s", "Session duration", "median over sessions of its last end - its first send", "requests", "median", "sessions", "sessions"),
    _f("session_turns_per_s", "requests/s", "Turns/s", "completed turns / (last end - first send)", "requests", "rate", "sessions", "sessions"),
    _f("session_output_tok_s", "tok/s", "Session output tok/s", "output tokens of every turn / (last end - first send)", "requests", "rate", "sessions", "sessions"),
    _f("session_send_late_p99_ms", "ms", "Late sends p99", "p99 over later turns (k >= 1) of sent - scheduled: how long after its answer's end + think time a turn was sent (the feeder's lateness: its body came late)", "requests", "percentile", "sessions", "sessions"),
    _f("open_loop_rate_per_s", "requests/s", "Rate asked", "arrival rate asked", "cell", "value", _L, "open_loop"),
    _f("open_loop_arrivals", "requests", "Arrivals", "arrivals scheduled in the window", "requests", "count", _L, "open_loop"),
    _f("open_loop_offered_rate_per_s", "requests/s", "Offered rate", "arrivals / window", "requests", "rate", _L, "open_loop"),
    _f("open_loop_achieved_rate_per_s", "requests/s", "Achieved rate", "window arrivals sent in the window / window", "requests", "rate", _L, "open_loop"),
    _f("open_loop_interarrival_cv", "", "Inter-arrival CV", "coefficient of variation of the scheduled gaps", "requests", "value", _L, "open_loop"),
    _f("open_loop_completed", "requests", "Completed arrivals", "window arrivals that completed", "requests", "count", _L, "open_loop"),
    _f("open_loop_failed", "requests", "Failed arrivals", "window arrivals that failed", "requests", "count", _L, "open_loop"),
    _f("open_loop_cancelled", "requests", "Cancelled arrivals", "window arrivals cut at the drain bound or never sent", "requests", "count", _L, "open_loop"),
    _f("open_loop_unsent", "requests", "Unsent arrivals", "window arrivals never sent", "requests", "count", _L, "open_loop"),
    _f("open_loop_completed_rate_per_s", "requests/s", "Completed rate", "completed / window", "requests", "rate", _L, "open_loop"),
    _f("open_loop_in_flight", "requests", "In flight", "requests in flight at each bin edge (a list)", "requests", "value", _L, "open_loop"),
    _f("open_loop_in_flight_max", "requests", "In flight (max)", "most requests in flight at a bin edge", "requests", "max", _L, "open_loop"),
    _f("open_loop_queue_p99_ms", "ms", "Queue p99", "p99 of sent - scheduled over every window arrival sent (queue_p99_ms: completed ones)", "requests", "percentile", _L, "open_loop"),
    _f("open_loop_kept_up", "", "Kept up", "the server kept up with the arrivals (verdict's rule)", "requests", "value", _L, "open_loop"),
    _f("open_loop_reason", "", "Why not kept up", "why the server did not keep up", "requests", "value", _L, "open_loop"),
    # --- reasoning (speedmatrix.reasoning): counted in the output tokens and throughput ---
    _f("reasoning_tokens", "tokens", "Reasoning tokens", "reasoning tokens of the window requests that completed (usage reasoning_tokens, else reasoning chunks streamed)", "requests", "count", _R, "reasoning"),
    _f("reasoning_share", "share", "Reasoning share", "reasoning_tokens / the output tokens of those requests", "requests", "share", _R, "reasoning"),
    # --- SLO (slo.evaluate; run.json's slo) ---
    _f("slo_slo", "ms", "SLO", "the targets judged (ms)", "run", "value", _S, "slo"),
    _f("slo_counted", "requests", "SLO counted", "requests judged against the SLO", "requests", "count", _S, "slo"),
    _f("slo_met", "requests", "SLO met", "judged requests that met every target", "requests", "count", _S, "slo"),
    _f("slo_attainment", "share", "Attainment", "met / counted", "requests", "share", _S, "slo"),
    _f("slo_goodput_req_s", "requests/s", "Goodput req/s", "completed requests meeting the SLO / window", "requests", "rate", _S, "slo"),
    _f("slo_goodput_tok_s", "tok/s", "Goodput tok/s", "output tokens of requests meeting the SLO / window", "requests, events", "rate", _S, "slo"),
    _f("slo_missed", "requests", "SLO missed", "requests that missed each target", "requests", "count", _S, "slo"),
    _f("slo_failed_most", "", "Failed most", "the target most requests missed", "requests", "value", _S, "slo"),
)
# fmt: on

#: the figures that carry a confidence interval ({fig}_lo, {fig}_hi)
CI_FIGURES = (
    "total_tok_s",
    "per_request_tok_s",
    "decode_tok_s_per_request",
    "ttft_ms",
    "tbt_ms",
)

#: column names run.cells no longer has -> the one that holds the figure now (a notebook
#: written against an older speedmatrix still finds it through `Run.table`). The median of
#: a latency distribution is its p50; the TTFT distribution of completed requests was
#: spelled like the headline TTFT; the TBT distribution's p50 is tbt_ms itself.
RENAMED = {
    "ttft_p50_ms": "ttft_completed_p50_ms",
    "ttft_median_ms": "ttft_completed_p50_ms",
    "ttft_mean_ms": "ttft_completed_mean_ms",
    "ttft_n": "ttft_completed_n",
    "ttft_p95_ms": "ttft_completed_p95_ms",
    "ttft_p99.9_ms": "ttft_completed_p99.9_ms",
    "tbt_median_ms": "tbt_ms",
    "tbt_p50_ms": "tbt_ms",
    "e2e_median_ms": "e2e_p50_ms",
    "tpot_median_ms": "tpot_p50_ms",
    "e2e_sched_median_ms": "e2e_sched_p50_ms",
    "ttft_sched_median_ms": "ttft_sched_p50_ms",
    "queue_median_ms": "queue_p50_ms",
}

#: latency distributions of run.json (`latency.cell_latency` keys, ``_ms`` dropped) -> the
#: prefix of their run.cells columns, where it differs
DISTRIBUTION_PREFIX = {"ttft": "ttft_completed"}


def _pattern(name: str) -> re.Pattern[str]:
    rx = re.escape(name).replace(r"\{p\}", r"[0-9]+(?:\.[0-9]+)?")
    rx = rx.replace(r"\{fig\}", "(?:" + "|".join(map(re.escape, CI_FIGURES)) + ")")
    return re.compile(rx + r"\Z")


@lru_cache(maxsize=1)
def _index() -> tuple[dict[str, Figure], list[tuple[re.Pattern[str], Figure]]]:
    exact: dict[str, Figure] = {}
    families: list[tuple[re.Pattern[str], Figure]] = []
    for f in _ENTRIES:
        if "{" in f.name:
            families.append((_pattern(f.name), f))
        else:
            exact[f.name] = f
    return exact, families


CATALOGUE: tuple[Figure, ...] = _ENTRIES


def find(column: str) -> Figure | None:
    """The catalogue entry of a run.cells column (a family's entry for ``e2e_p99_ms``,
    ``tbt_ms_lo``), or None: a column with no entry is a defect (test_figures.py)."""
    exact, families = _index()
    if column in exact:
        return exact[column]
    for rx, f in families:
        if rx.match(column):
            return f
    return None


def label(column: str) -> str:
    """The report's label of a column (``"e2e_p99_ms"`` -> ``"E2E p99"``); the column
    itself when the catalogue does not know it."""
    f = find(column)
    if f is None:
        return column
    m = re.match(r"(.*)_p([0-9.]+)_ms\Z", column)
    if "{p}" in f.label and m:
        return f.label.replace("{p}", m.group(2))
    if "{fig}" in f.label:
        fig = column.rsplit("_", 1)[0]
        base = find(fig)
        return f.label.replace("{fig}", base.label if base else fig)
    return f.label


def markdown_table() -> str:
    """docs/metrics.md's figures table, generated from the catalogue."""
    lines = [
        "| column | unit | definition | reads | summary | computed by |",
        "|---|---|---|---|---|---|",
    ]
    for f in _ENTRIES:
        lines.append(
            f"| `{f.name}` | {f.unit or '—'} | {f.definition} | {f.reads} | {f.summary} "
            f"| {'C++ core' if f.by == 'core' else f.by + '.py'} |"
        )
    return "\n".join(lines) + "\n"
