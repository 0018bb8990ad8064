"""The `cache_hit_mismatch` rule: a cell's delivered prefix-cache hit rate is not the one
it asked for (`speedmatrix.prefixcache`)."""

from __future__ import annotations

__all__ = ["CACHE_HIT_TOLERANCE", "cache_hit_mismatch"]

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
