"""Running and judging a cached-fraction cell (`speedmatrix.trafficplan`): the prefix it
warms, the server's counters around it, and its ``cached_fraction`` /
``delivered_cached_fraction`` columns (`speedmatrix.prefixcache` holds the arithmetic).

The sweep, for a cell with cached fraction f:

1. makes the cell's prompts with `prompt_seed` (the prefix is this try's of the cell) and
   ``shared_prefix`` = `prefixcache.shared_prefix_tokens` (C, f);
2. sends `WARM_INDEX`'s prompt of the same factory once, with one output token
   (`warm_prefix`): it carries the prefix, its own salt and filler, so the server then
   holds the prefix and none of the window's prompts;
3. reads the server's prefix-cache counters (`read_counters`) before and after the
   window, kept in the cell as ``cache_counters`` (the records cannot hold them, so
   ``speedmatrix recompute`` reads them back from the stored cell).

`speedmatrix.verdict.cache.cache_columns` gives the cell's columns from its records
(``cached_tokens`` per request, where the record has it) or else from those counters.
"""

from __future__ import annotations

import json
import math

from speedmatrix.adapters.probe import parse_prometheus
from speedmatrix.http import ConnectError, HttpClient, HttpError
from speedmatrix.prefixcache import COUNTER_PAIRS, prefix_seed

__all__ = ["WARM_INDEX", "prompt_seed", "read_counters", "warm_prefix"]

#: the factory index of the prompt that warms a cell's prefix (the window's are 0..N-1)
WARM_INDEX = 1_000_003
#: the counters of `prefixcache.COUNTER_PAIRS`, read by name
_COUNTERS = tuple(name for pair in COUNTER_PAIRS for name in pair)


def prompt_seed(run_seed: int, cell_key: str) -> int:
    """The seed of a cached-fraction cell's prompt factory from the run's seed and a key
    naming the cell's try (its id and the process's nonce): its prefix and salts are its
    own (no other cell, repetition, run or try of it shares them)."""
    return prefix_seed(run_seed, cell_key) & 0xFFFFFFFF


def read_counters(client: HttpClient, metrics_url: str | None) -> dict[str, float] | None:
    """The server's prefix-cache counters now, each summed over its labels; None without a
    metrics page, or when it does not answer or carries none of them."""
    if not metrics_url:
        return None
    try:
        text = client.get_text(metrics_url)
    except (HttpError, ConnectError):
        return None
    out: dict[str, float] = {}
    for name, _labels, value in parse_prometheus(text):
        if name in _COUNTERS and math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out or None


def warm_prefix(client: HttpClient, endpoint: str, body: bytes) -> str:
    """Sends the warm-up body (one output token, not streamed); "" when answered, else one
    line saying why (the cell is measured anyway: its delivered share will say it)."""
    payload = json.loads(body)
    payload["stream"] = False
    payload.pop("stream_options", None)
    try:
        client.post_json(endpoint, payload)
    except (HttpError, ConnectError) as exc:
        return f"the prefix warm-up request failed: {str(exc).splitlines()[0][:160]}"
    return ""
