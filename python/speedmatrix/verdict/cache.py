"""The `cache_hit_mismatch` rule: a cell's delivered prefix-cache hit rate is not the one
it asked for (`speedmatrix.prefixcache`); and `cache_columns`, the figures it reads, from a
cell's records and the counters the sweep read around it (`speedmatrix.cachedcell`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from speedmatrix.prefixcache import delivered

__all__ = ["CACHE_HIT_TOLERANCE", "cache_columns", "cache_hit_mismatch"]

#: requested and delivered cached fractions further apart than this are flagged (5 points)
CACHE_HIT_TOLERANCE = 0.05


def cache_hit_mismatch(
    requested: float | None, delivered: float | None, tolerance: float = CACHE_HIT_TOLERANCE
) -> bool:
    """True when the cell asked for a cached fraction, the server reported one, and the two
    differ by more than ``tolerance``. Nothing asked or nothing reported: no flag."""
    if requested is None or delivered is None:
        return False
    return abs(delivered - requested) > tolerance + 1e-12


def _usage_cached(records: Any) -> tuple[list[int], list[int | None]] | None:
    """(prompt tokens, cached tokens or None) of the cell's window requests whose usage came
    (prompt tokens known; a request cut at the window's end may have had none), when the
    record carries ``cached_tokens`` (-1 where that usage did not say)."""
    req = records.requests
    if "cached_tokens" not in req:
        return None
    rows = np.flatnonzero((req["phase"] == 1) & (req["prompt_tokens"] > 0))
    cached = [int(c) if c >= 0 else None for c in req["cached_tokens"][rows]]
    return [int(p) for p in req["prompt_tokens"][rows]], cached


def cache_columns(shape: Any, records: Any) -> dict[str, Any]:
    """A cached-fraction cell's columns: ``cached_fraction`` (asked),
    ``delivered_cached_fraction`` and ``delivered_cached_source`` (usage, else counters;
    None when neither says), and the ``cache_counters`` read around the window; {} for a
    cell that asked for no cached fraction."""
    asked = getattr(shape, "cached_fraction", None)
    if asked is None:
        return {}
    counters = getattr(shape, "cache_counters", None) or {}
    before, after = counters.get("before"), counters.get("after")
    usage = _usage_cached(records)
    prompts, cached = usage if usage is not None else ([], [])
    rate, source = delivered(
        prompts, cached, counters=(before, after) if before and after else None
    )
    out: dict[str, Any] = {
        "cached_fraction": float(asked),
        "delivered_cached_fraction": rate,
        "delivered_cached_source": source,
    }
    if counters:
        out["cache_counters"] = {"before": before, "after": after}
    return out
