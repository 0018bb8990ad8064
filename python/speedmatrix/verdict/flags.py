"""The flag rules of a decode cell: each one small pure function of `Evidence` and `Rules`.

`Evidence` holds every number a flag rule reads (gathered from the records and the cell's
figures by `speedmatrix.verdict.cells`); `FLAG_RULES` lists the rules in the order their
flags are stored. A new rule is a field of `Evidence` (with a default that raises no
flag, so saved runs recompute the same), a function here, and a line in `FLAG_RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from speedmatrix.verdict.cache import cache_hit_mismatch
from speedmatrix.verdict.client import near_limit
from speedmatrix.verdict.names import Flag
from speedmatrix.verdict.reasoning import reasoning_hidden
from speedmatrix.verdict.rules import Rules

__all__ = ["FLAG_RULES", "Evidence", "flags_of"]


@dataclass(frozen=True)
class Evidence:
    """What the flag rules of one decode cell read. Defaults raise no flag."""

    #: the server was seen idle before the cell
    idle: bool = True
    #: the engine generates exactly max_tokens (`EngineFacts.output_forced`)
    output_forced: bool = True
    #: the C++ drift test found throughput changing across the window
    drifting: bool = False
    #: the prompt-token check: True, False (the server counted another length), None (no count)
    prompt_exact: bool | None = None
    #: output counts rest on per-chunk estimates (`tokens_estimated`)
    tokens_estimated: bool = False
    #: the client's CPU time over the cell (warm-up included), and the cell's length
    client_cpu_s: float = 0.0
    cell_s: float = 0.0
    #: the client's roofline over the cell's demand (`speedmatrix.verdict.client`; None: no
    #: selftest on the host)
    client_headroom: float | None = None
    #: N, whether the cell is open loop, and the server's mean running count (None: no gauge)
    concurrency: int = 1
    open_loop: bool = False
    running_mean: float | None = None
    #: window requests sent from the ramp's start, and those still without a first token at
    #: the window's end that had waited longer than the median TTFT
    started: int = 1
    unserved_longer: int = 0
    #: window requests cut as stalls; window requests answered 429
    stalls: int = 0
    http_429: int = 0
    #: open loop: the server kept up with the arrivals (None: closed loop)
    kept_up: bool | None = None
    #: closed loop: a steady-state window (else a run saved before them); the ramp cap
    #: opened it; how many of the first N streamed; ramp and window lengths (ns)
    steady: bool = True
    ramp_capped: bool = False
    first_wave_streamed: int = 1
    ramp_ns: int = 0
    window_ns: int = 1
    #: window requests whose usage was below the chunks that carried text / far above them
    usage_below: int = 0
    usage_above: int = 0
    #: warm-up prompts that never completed (failed or timed out on every try)
    warmup_unfinished: int = 0
    #: share of the window's token events that arrived in a read with another (None: not known)
    coalesced_share: float | None = None
    #: the prefix-cache axis: the cached fraction the cell asked for and the one the server
    #: delivered (None: no axis / nothing reported)
    cached_fraction: float | None = None
    delivered_cached_fraction: float | None = None
    #: per window request that completed: (reasoning tokens its usage reported, -1 unsaid;
    #: reasoning chunks it streamed) (`speedmatrix.reasoning.hidden_evidence`)
    reasoning: tuple[tuple[int, int], ...] = ()
    #: a sessions cell: p99 of its later turns' sent - scheduled, ms (None: not one, or none)
    session_send_late_p99_ms: float | None = None
    # (an engine's own evidence, such as the preemptions a server reports, goes here too)


def busy_at_start(e: Evidence, rules: Rules) -> bool:
    return not e.idle


def output_not_forced(e: Evidence, rules: Rules) -> bool:
    # the engine may stop a request early at end-of-sequence (TGI, Ollama, generic
    # servers): output lengths, and so the KV load, are not the asked ones
    return not e.output_forced


def drift(e: Evidence, rules: Rules) -> bool:
    return e.drifting


def prompt_mismatch(e: Evidence, rules: Rules) -> bool:
    return e.prompt_exact is False


def estimated_tokens(e: Evidence, rules: Rules) -> bool:
    return e.tokens_estimated


def client_bound(e: Evidence, rules: Rules) -> bool:
    return e.cell_s > 0 and e.client_cpu_s > rules.client_bound_cpu_share * e.cell_s


def client_near_limit(e: Evidence, rules: Rules) -> bool:
    return near_limit(e.client_headroom, rules.client_near_limit_headroom)


def server_running_mismatch(e: Evidence, rules: Rules) -> bool:
    # an open-loop cell without a concurrency bound (N 0) has no N to compare with
    return (
        e.running_mean is not None
        and (not e.open_loop or e.concurrency > 0)
        and e.running_mean
        > e.concurrency * rules.running_mismatch_factor + rules.running_mismatch_slack
    )


def ttft_unserved(e: Evidence, rules: Rules) -> bool:
    return bool(e.unserved_longer) and e.unserved_longer > rules.ttft_unserved_share * e.started


def stalls(e: Evidence, rules: Rules) -> bool:
    return e.stalls > 0


def rate_limited(e: Evidence, rules: Rules) -> bool:
    return e.http_429 > 0


def behind(e: Evidence, rules: Rules) -> bool:
    return e.open_loop and e.kept_up is False


def long_ramp(e: Evidence, rules: Rules) -> bool:
    if e.open_loop:
        return False
    if e.steady:
        return e.ramp_capped
    # a run saved before steady-state windows: judged by how long its first wave took
    return e.first_wave_streamed < e.concurrency or e.ramp_ns > rules.ramp_share * e.window_ns


def usage_mismatch(e: Evidence, rules: Rules) -> bool:
    return e.usage_below > 0 or e.usage_above > 0


def warmup_unfinished(e: Evidence, rules: Rules) -> bool:
    return e.warmup_unfinished > 0


def coalesced_delivery(e: Evidence, rules: Rules) -> bool:
    return e.coalesced_share is not None and e.coalesced_share > rules.coalesced_share_max


def cache_hit_mismatch_rule(e: Evidence, rules: Rules) -> bool:
    return cache_hit_mismatch(
        e.cached_fraction, e.delivered_cached_fraction, rules.cache_hit_tolerance
    )


def reasoning_hidden_rule(e: Evidence, rules: Rules) -> bool:
    return reasoning_hidden(e.reasoning)


def sessions_late(e: Evidence, rules: Rules) -> bool:
    late = e.session_send_late_p99_ms
    return late is not None and late > rules.sessions_late_ms


#: every decode-cell flag rule, in the order the flags are stored
FLAG_RULES: tuple[tuple[Flag, Callable[[Evidence, Rules], bool]], ...] = (
    (Flag.BUSY_AT_START, busy_at_start),
    (Flag.OUTPUT_NOT_FORCED, output_not_forced),
    (Flag.DRIFT, drift),
    (Flag.PROMPT_MISMATCH, prompt_mismatch),
    (Flag.ESTIMATED_TOKENS, estimated_tokens),
    (Flag.CLIENT_BOUND, client_bound),
    (Flag.SERVER_RUNNING_MISMATCH, server_running_mismatch),
    (Flag.TTFT_UNSERVED, ttft_unserved),
    (Flag.STALLS, stalls),
    (Flag.RATE_LIMITED, rate_limited),
    (Flag.BEHIND, behind),
    (Flag.LONG_RAMP, long_ramp),
    (Flag.USAGE_MISMATCH, usage_mismatch),
    (Flag.WARMUP_UNFINISHED, warmup_unfinished),
    (Flag.COALESCED_DELIVERY, coalesced_delivery),
    (Flag.CACHE_HIT_MISMATCH, cache_hit_mismatch_rule),
    (Flag.CLIENT_NEAR_LIMIT, client_near_limit),
    (Flag.REASONING_HIDDEN, reasoning_hidden_rule),
    (Flag.SESSIONS_LATE, sessions_late),
)


def flags_of(e: Evidence, rules: Rules) -> list[str]:
    """The flags a decode cell carries (their string values, in `FLAG_RULES` order)."""
    return [flag.value for flag, rule in FLAG_RULES if rule(e, rules)]
