"""The names of the verdict: a cell's status (`Status`), its flags (`Flag`) and what each
flag means.

Both enums are string-valued: a stored cell keeps the plain strings (``"valid"``,
``"drift"``), so run.json reads as before, and ``Status.VALID == "valid"``. The report
reads a flag's words from here (`Flag.short`, `Flag.text`), so a flag and its meaning are
written once.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["REPORTED", "Flag", "Status"]


class Status(str, Enum):
    """A cell's status (DESIGN.md "Status")."""

    VALID = "valid"
    QUEUED = "queued"
    OVER_CAPACITY = "over_capacity"
    ERROR = "error"


#: the statuses whose figures the report shows (and whose flags it lists)
REPORTED = (Status.VALID.value, Status.QUEUED.value)


class Flag(str, Enum):
    """A doubt about a cell's figures; the figures are still reported."""

    BUSY_AT_START = "busy_at_start"
    OUTPUT_NOT_FORCED = "output_not_forced"
    DRIFT = "drift"
    PROMPT_MISMATCH = "prompt_mismatch"
    ESTIMATED_TOKENS = "estimated_tokens"
    CLIENT_BOUND = "client_bound"
    #: `speedmatrix.verdict.client`: the cell needed more than half the client's roofline
    CLIENT_NEAR_LIMIT = "client_near_limit"
    SERVER_RUNNING_MISMATCH = "server_running_mismatch"
    TTFT_UNSERVED = "ttft_unserved"
    STALLS = "stalls"
    RATE_LIMITED = "rate_limited"
    BEHIND = "behind"
    LONG_RAMP = "long_ramp"
    USAGE_MISMATCH = "usage_mismatch"
    WARMUP_UNFINISHED = "warmup_unfinished"
    COALESCED_DELIVERY = "coalesced_delivery"
    #: the prefix-cache axis's rule (`speedmatrix.verdict.cache`)
    CACHE_HIT_MISMATCH = "cache_hit_mismatch"
    #: reported reasoning tokens mostly never streamed (`speedmatrix.verdict.reasoning`)
    REASONING_HIDDEN = "reasoning_hidden"
    #: a sessions cell's feeder sent later turns late (`speedmatrix.verdict.sessions`)
    SESSIONS_LATE = "sessions_late"
    #: the measurement's rule, not a FLAG_RULES one (`speedmatrix.verdict.preemption`)
    PREEMPTED = "preempted"
    #: written by no rule today; kept for the report's text of runs that carry it
    INTERRUPTED = "interrupted"

    @property
    def short(self) -> str:
        """The flag's name in a table (a few words)."""
        return _SHORT[self]

    @property
    def text(self) -> str:
        """What the flag means for the figures (a sentence or two for the report)."""
        return _TEXT[self]


_SHORT = {
    Flag.BUSY_AT_START: "Busy at start",
    Flag.DRIFT: "Drift",
    Flag.PROMPT_MISMATCH: "Prompt mismatch",
    Flag.ESTIMATED_TOKENS: "Estimated tokens",
    Flag.CLIENT_BOUND: "Client bound",
    Flag.CLIENT_NEAR_LIMIT: "Client near its limit",
    Flag.INTERRUPTED: "Interrupted",
    Flag.SERVER_RUNNING_MISMATCH: "Server running mismatch",
    Flag.LONG_RAMP: "Long ramp",
    Flag.STALLS: "Stalls",
    Flag.OUTPUT_NOT_FORCED: "Output not forced",
    Flag.TTFT_UNSERVED: "TTFT reads low",
    Flag.BEHIND: "Server could not keep up",
    Flag.RATE_LIMITED: "Rate limited",
    Flag.PREEMPTED: "Preempted",
    Flag.USAGE_MISMATCH: "Usage mismatch",
    Flag.WARMUP_UNFINISHED: "Warm-up unfinished",
    Flag.COALESCED_DELIVERY: "Coalesced delivery",
    Flag.CACHE_HIT_MISMATCH: "Cache hit mismatch",
    Flag.REASONING_HIDDEN: "Reasoning hidden",
    Flag.SESSIONS_LATE: "Sessions late",
}

_TEXT = {
    Flag.BUSY_AT_START: "Busy at start: the server was not idle when the cell began.",
    Flag.DRIFT: "Drift: throughput changed significantly across the window.",
    Flag.PROMPT_MISMATCH: (
        "Prompt mismatch: the server counted a different prompt length than asked."
    ),
    Flag.ESTIMATED_TOKENS: (
        "Estimated tokens: output tokens were counted one per streamed chunk, not taken "
        "from the server's usage, so they can read low where a chunk carries several tokens."
    ),
    Flag.CLIENT_BOUND: "Client bound: the benchmark client was busy enough to limit the figures.",
    Flag.CLIENT_NEAR_LIMIT: (
        "Client near its limit: the cell made the client take in more than half of what "
        "it can on this host (speedmatrix selftest; see the cell's client_headroom), so "
        "the client's own delay may be in the figures: run with more --client-threads."
    ),
    Flag.INTERRUPTED: "Interrupted: the run stopped during or after this cell.",
    Flag.SERVER_RUNNING_MISMATCH: (
        "Server running mismatch: the server ran more requests than the "
        "cell sent (work left over from earlier cells)."
    ),
    Flag.LONG_RAMP: (
        "Long ramp: the N requests did not all stream (nor settle at a plateau) before "
        "the ramp cap, so the window opened before steady state and the figures may "
        "read lower."
    ),
    Flag.STALLS: (
        "Stalls: streams went silent mid-window and were cut and replaced (errors.stall); "
        "the figures are those of the other streams."
    ),
    Flag.TTFT_UNSERVED: (
        "TTFT reads low: requests sent in the window were still waiting for their "
        "first token when it ended, longer than the median TTFT, which counts only "
        "the requests that got one (see the cell's ttft_unserved)."
    ),
    Flag.OUTPUT_NOT_FORCED: (
        "Output not forced: the server cannot be told to ignore end-of-sequence, "
        "so requests may end early and be replaced (more prefill in the window)."
    ),
    Flag.RATE_LIMITED: (
        "Rate limited: the server answered 429 Too Many Requests (errors.http_429); each "
        "slot waited as it asked (Retry-After, at most 10 s) or backed off (backoffs, "
        "backoff_s), so the figures are those of a throttled client, not the server's capacity."
    ),
    Flag.BEHIND: (
        "Server could not keep up: at this request rate the backlog grew through the "
        "window (latency from the scheduled time grew, or arrivals were unfinished at "
        "the drain bound; see the cell's open_loop.reason)."
    ),
    Flag.USAGE_MISMATCH: (
        "Usage mismatch: the server's usage count disagreed with what it streamed (see the "
        "cell's usage_mismatch). A usage below the chunks that carried text cannot be right: "
        "those requests were counted as received, one token per chunk. A usage far above "
        "them was kept (a server that sends several tokens per chunk does this), but if "
        "its chunks carry one token each, tok/s reads high."
    ),
    Flag.WARMUP_UNFINISHED: (
        "Warm-up unfinished: some warm-up prompts never completed (failed or timed out on "
        "every try), so the window began from a server less warm than planned: its caches "
        "may not hold those prompts and the first requests may read slower."
    ),
    Flag.CACHE_HIT_MISMATCH: (
        "Cache hit mismatch: the prefix-cache hit rate the server delivered (the cell's "
        "delivered_cached_fraction) is more than 5 points from the one the cell asked for "
        "(cached_fraction), so its TTFT is that of another cache load."
    ),
    Flag.PREEMPTED: (
        "Preempted: the server preempted requests during the cell (its KV cache could not hold "
        "every running request), so some work was done twice and the figures are not those of "
        "a clean run at this load (see the cell's server.preemptions)."
    ),
    Flag.COALESCED_DELIVERY: (
        "Coalesced delivery: many token events arrived several to a socket read (a server "
        "or proxy that flushes in bursts), so the time between tokens is the gap between "
        "reads spread over their events: per-token times show the delivery, not the decode "
        "(see the cell's coalesced_share)."
    ),
    Flag.REASONING_HIDDEN: (
        "Reasoning hidden: the server reported reasoning tokens in its usage that it never "
        "streamed, so the first visible chunk came after a silent thinking phase: TTFT and "
        "per-request speed read the thinking as waiting."
    ),
    Flag.SESSIONS_LATE: (
        "Sessions late: the client sent later turns well after they were due (their answer's "
        "end + the think time), at p99 beyond the sessions_late_ms rule (see the cell's "
        "session_send_late_p99_ms): the feeder that builds each next turn was slow, so the "
        "server saw a lighter, later load than the sessions asked for."
    ),
}
