"""What the records say about a cell's window, beyond the C++ figures: its first wave, the
requests still unserved at its end, the client's view of queuing, how output tokens were
counted and whether the warm-up finished. Pure functions of the request columns (numpy
arrays), each tested on synthetic records.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "client_queue_signal",
    "first_wave_settled",
    "first_wave_streamed",
    "tokens_estimated",
    "ttft_unserved",
    "usage_mismatches",
    "warmup_unfinished",
]

# outcome codes of the request records (cpp/include/speedmatrix/records.hpp)
OK = 1
CANCELLED = 2
ERROR = 3
# token_source codes (cpp/include/speedmatrix/openai.hpp TokenSource)
SOURCE_CHUNKS = 1
SOURCE_USAGE_BELOW_CHUNKS = 4
SOURCE_USAGE_ABOVE_CHUNKS = 5


def tokens_estimated(
    token_source: np.ndarray,
    outcome: np.ndarray,
    warmup_source: np.ndarray | None = None,
    warmup_outcome: np.ndarray | None = None,
) -> bool:
    """Whether the cell's output counts rest on per-chunk estimates (token_source 1).

    Only completed requests count: an engine that sends usage in its final chunk (llama.cpp)
    has none for the requests the window's end cut, and those few are counted per chunk
    although every completed request had exact usage. A window in which no request
    completed (long requests, or a queued cell whose running ones were all cut) is judged
    by the cell's completed warm-up requests, which show whether the engine sends usage.
    With no completed request at all, any per-chunk count flags the cell."""
    sources = np.asarray(token_source)
    if not len(sources):
        return False
    completed = np.asarray(outcome) == OK
    if completed.any():
        return bool(np.any(sources[completed] == 1))
    if warmup_source is not None and warmup_outcome is not None:
        warm = np.asarray(warmup_source)[np.asarray(warmup_outcome) == OK]
        if len(warm):
            return bool(np.any(warm == SOURCE_CHUNKS))
    return bool(np.any(sources == SOURCE_CHUNKS))


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
        (req["phase"] == 1) & (sent >= t0) & (sent <= t1) & (req["outcome"] != ERROR)
    )
    unserved = rows[(first[rows] < 0) | (first[rows] > t1)]
    if ttft_ms is None:
        return len(unserved), len(unserved)
    longer = np.count_nonzero((t1 - sent[unserved]) / 1e6 > ttft_ms)
    return len(unserved), int(longer)


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


def usage_mismatches(token_source: np.ndarray) -> tuple[int, int]:
    """Requests whose usage disagreed with their stream, as the C++ decoder judged them
    (`TokenSource`): (usage below the chunks that carried text, counted as received;
    usage far above them, kept)."""
    sources = np.asarray(token_source)
    below = int(np.count_nonzero(sources == SOURCE_USAGE_BELOW_CHUNKS))
    above = int(np.count_nonzero(sources == SOURCE_USAGE_ABOVE_CHUNKS))
    return below, above


def warmup_unfinished(req: dict) -> int:
    """Warm-up prompts none of whose tries completed (each failed, timed out or was cut):
    the window then began from a server that never finished the warm-up planned for it.
    A try is a warm-up request (phase 0); its prompt is its ``body``."""
    phase = np.asarray(req["phase"])
    warm = phase == 0
    if not warm.any():
        return 0
    body = np.asarray(req["body"])[warm]
    ok = np.asarray(req["outcome"])[warm] == OK
    return len(np.setdiff1d(np.unique(body), np.unique(body[ok])))
