"""Reasoning-aware timing of a decode cell (issue 23 item 3): time to first byte, first token
(any channel) and first *content* token side by side, and the reasoning tokens' share of the
output. One derivation, read by `speedmatrix.verdict.cells` (and so by ``recompute``).

The request records carry what the client saw and what the server said
(`_core.Requests`): ``first_byte_ns``, ``first_token_ns`` (reasoning or content),
``first_content_ns`` (content only), ``reasoning_tokens`` (usage's
``completion_tokens_details.reasoning_tokens``, -1 unsaid) and ``reasoning_deltas`` (chunks
that streamed reasoning). Reasoning tokens are output tokens: throughput counts them as it
counts content (docs/metrics.md "Reasoning").

Pure: numpy arrays in, numbers out. Records saved before these columns existed give None.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["hidden_evidence", "reasoning_figures", "time_to_ms"]

_OK = 1  # Outcome::kOk (records.hpp)


def time_to_ms(sent_ns: np.ndarray, at_ns: np.ndarray) -> float | None:
    """Median of ``at - sent`` in ms over the requests that reached ``at`` (not -1);
    None when none did."""
    sent, at = np.asarray(sent_ns, np.int64), np.asarray(at_ns, np.int64)
    reached = at >= 0
    if not reached.any():
        return None
    return float(np.median(at[reached] - sent[reached])) / 1e6


def _has_columns(requests: Mapping[str, np.ndarray]) -> bool:
    return all(k in requests for k in ("first_content_ns", "reasoning_tokens", "reasoning_deltas"))


def _completed(requests: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window requests that completed: their rows, the reasoning tokens the server
    reported (-1 unsaid) and the reasoning chunks they streamed."""
    done = np.flatnonzero(
        (np.asarray(requests["phase"]) == 1) & (np.asarray(requests["outcome"]) == _OK)
    )
    said = np.asarray(requests["reasoning_tokens"], np.int64)[done]
    streamed = np.asarray(requests["reasoning_deltas"], np.int64)[done]
    return done, said, streamed


def reasoning_figures(
    requests: Mapping[str, np.ndarray], ramp_ns: int, t1_ns: int
) -> dict[str, float | int | None]:
    """The cell's ``ttfb_ms``, ``ttfo_ms``, ``reasoning_tokens`` and ``reasoning_share``.

    TTFB and TTFO are medians over the requests `ttft_ms` reads (window requests sent in
    [ramp, t1]) that reached their first byte / first content. The reasoning figures read
    the window requests that completed: the reasoning tokens they carried (summed) and their
    share of those requests' output tokens. A cell whose server neither reported nor
    streamed any reasoning has None for both (no reasoning channel), not 0.
    """
    out: dict[str, float | int | None] = dict.fromkeys(
        ("ttfb_ms", "ttfo_ms", "reasoning_tokens", "reasoning_share")
    )
    phase = np.asarray(requests["phase"])
    sent = np.asarray(requests["sent_ns"], np.int64)
    window = phase == 1
    timed = np.flatnonzero(window & (sent >= ramp_ns) & (sent <= t1_ns))
    if "first_byte_ns" in requests:  # records built by hand may lack it
        out["ttfb_ms"] = time_to_ms(sent[timed], np.asarray(requests["first_byte_ns"])[timed])
    if not _has_columns(requests):
        return out  # a run saved before issue 23: TTFB only
    out["ttfo_ms"] = time_to_ms(sent[timed], np.asarray(requests["first_content_ns"])[timed])
    done, said, streamed = _completed(requests)
    if not ((said >= 0).any() or (streamed > 0).any()):
        return out
    # the server's count where it said one, else the chunks it streamed (one token a chunk,
    # the decoder's own estimate)
    reasoning = int(np.where(said >= 0, said, streamed).sum())
    output = int(np.asarray(requests["output_tokens"], np.int64)[done].sum())
    out["reasoning_tokens"] = reasoning
    out["reasoning_share"] = min(reasoning / output, 1.0) if output > 0 else None
    return out


def hidden_evidence(requests: Mapping[str, np.ndarray]) -> tuple[tuple[int, int], ...]:
    """Per window request that completed, ``(reported, streamed)``: what the
    `speedmatrix.verdict.reasoning` rule reads; () for records without the columns."""
    if not _has_columns(requests):
        return ()
    _done, said, streamed = _completed(requests)
    return tuple(zip(said.tolist(), streamed.tolist(), strict=True))
