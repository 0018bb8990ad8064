"""The prefix-cache axis: what a cell asks for (`cached_fraction`) and what the server
delivered (`delivered_cached_fraction`), as pure functions of numbers.

A cell with cached fraction f sends prompts of exactly C tokens whose first
``shared_prefix_tokens(C, f)`` tokens are one prefix the server has already seen (a
warm-up sends it first) and whose rest is unique per request. The prefix is drawn from
``prefix_seed(run_seed, cell_key)``, so two cells never share a prefix.

The delivered fraction is read, in this order of preference, from
- the responses' ``usage.prompt_tokens_details.cached_tokens`` (vLLM, SGLang, the
  built-in engine): `delivered_from_usage`;
- llama.cpp's per-response ``timings.cache_n`` / ``timings.prompt_n``:
  `delivered_from_timings`;
- the server's counters across the measured window (vLLM
  ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``, SGLang
  ``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total``):
  `delivered_from_counters`.
Each returns None when its source says nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

__all__ = [
    "COUNTER_PAIRS",
    "delivered",
    "delivered_from_counters",
    "delivered_from_timings",
    "delivered_from_usage",
    "parse_cached_fractions",
    "prefix_seed",
    "shared_prefix_tokens",
]

#: (hits counter, queries counter) per server family, both in prompt tokens; a family's
#: counters are summed over their labels (SGLang splits cached tokens by cache_source)
COUNTER_PAIRS = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("sglang:cached_tokens_total", "sglang:prompt_tokens_total"),
)


def parse_cached_fractions(text: str) -> list[float]:
    """``"0,0.5,0.9"`` -> ``[0.0, 0.5, 0.9]``. Each value is in [0, 1) (a prompt's last
    token is always computed), given once. Raises ValueError with one line otherwise."""
    values: list[float] = []
    for part in str(text).split(","):
        item = part.strip()
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"cached_fraction: {item!r} is not a number") from None
        if not 0.0 <= value < 1.0:
            raise ValueError(f"cached_fraction: {item} is outside [0, 1)")
        if value in values:
            raise ValueError(f"cached_fraction: {item} is given twice")
        values.append(value)
    return values


def shared_prefix_tokens(prompt_tokens: int, fraction: float) -> int:
    """Tokens of a C-token prompt that repeat the cell's shared prefix: f x C rounded to
    the nearest token, and at most C - 1 (the last token is the request's own)."""
    if prompt_tokens <= 0:
        return 0
    return min(round(fraction * prompt_tokens), prompt_tokens - 1)


def prefix_seed(run_seed: int, cell_key: str) -> int:
    """The seed of a cell's shared prefix: a hash of the run's seed and the cell's key, so
    no two cells (nor two runs with different seeds) share a prefix."""
    digest = hashlib.sha256(f"{run_seed}\x00{cell_key}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def delivered_from_usage(
    prompt_tokens: Sequence[int], cached_tokens: Sequence[int | None]
) -> float | None:
    """Cached over prompt tokens of a cell's window requests. A request whose usage has
    no cached_tokens counts 0 when another request of the cell reported some (servers
    leave the field out at zero); None when no request reported any."""
    if not any(c is not None for c in cached_tokens):
        return None
    total = sum(prompt_tokens)
    if total <= 0:
        return None
    return sum(c or 0 for c in cached_tokens) / total


def delivered_from_timings(prompt_n: Sequence[int], cache_n: Sequence[int]) -> float | None:
    """llama.cpp: ``cache_n`` tokens were reused, ``prompt_n`` computed, per response."""
    total = sum(prompt_n) + sum(cache_n)
    return sum(cache_n) / total if total > 0 else None


def delivered_from_counters(
    before: Mapping[str, float], after: Mapping[str, float]
) -> float | None:
    """Hits over queries between two reads of the server's counters (each a metric name
    -> value summed over labels), from the first family both reads carry; None when
    neither family is there or no prompt token was counted between them."""
    for hits, queries in COUNTER_PAIRS:
        if all(name in before and name in after for name in (hits, queries)):
            asked = after[queries] - before[queries]
            if asked <= 0:
                return None
            return (after[hits] - before[hits]) / asked
    return None


def delivered(
    prompt_tokens: Sequence[int],
    cached_tokens: Sequence[int | None] = (),
    *,
    timings: tuple[Sequence[int], Sequence[int]] | None = None,
    counters: tuple[Mapping[str, float], Mapping[str, float]] | None = None,
) -> tuple[float | None, str | None]:
    """A cell's delivered cached fraction and its source (``"usage"``, ``"timings"``,
    ``"counters"``), the first source in that order that says something; (None, None)
    when none does. ``timings``: llama.cpp's (prompt_n, cache_n) per response;
    ``counters``: the server's counters read before and after the window."""
    rate = delivered_from_usage(prompt_tokens, cached_tokens)
    if rate is not None:
        return rate, "usage"
    if timings is not None:
        rate = delivered_from_timings(*timings)
        if rate is not None:
            return rate, "timings"
    if counters is not None:
        rate = delivered_from_counters(*counters)
        if rate is not None:
            return rate, "counters"
    return None, None
