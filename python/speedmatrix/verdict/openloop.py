"""The open-loop judgement: did the server keep up with the arrival rate?

Pure and free of other speedmatrix modules: `speedmatrix.latency` computes an open-loop
cell's figures and `speedmatrix.verdict.cells` hands it this rule for ``kept_up`` (the
cell's `behind` flag reads it); latency imports no verdict.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["GROWTH_RATIO", "MIN_QUARTER", "kept_up"]

#: the backlog grew when the median latency from the scheduled time of the last quarter
#: of the window's arrivals exceeds this many times the first quarter's
GROWTH_RATIO = 1.5
#: quarters smaller than this many arrivals are too few to compare: no growth is judged
MIN_QUARTER = 5


def kept_up(
    e2e_from_schedule_ms: np.ndarray,
    cancelled: int,
    unsent: int,
    growth_ratio: float = GROWTH_RATIO,
) -> tuple[bool, str]:
    """Whether the server kept up, and if not why (one line).

    ``e2e_from_schedule_ms``: one value per window arrival in schedule order, its latency
    from its scheduled time to its last token (NaN when it did not complete);
    ``cancelled``: arrivals still unfinished at the drain bound (``unsent`` of them never
    sent). Any such arrival means the server fell behind; otherwise a latency that grows
    from the first quarter of the arrivals to the last does."""
    e2e = np.asarray(e2e_from_schedule_ms, dtype=float)
    n = len(e2e)
    if cancelled:
        return False, (
            f"{cancelled} of {n} arrivals were unfinished when the drain bound passed"
            + (f" ({unsent} never sent)" if unsent else "")
        )
    quarter = n // 4
    if quarter < MIN_QUARTER:
        return True, ""
    first, last = _median(e2e[:quarter]), _median(e2e[-quarter:])
    if first > 0 and last > growth_ratio * first:
        return False, (
            f"latency from the scheduled time grew from a median {first / 1000:.3g} s "
            f"(first quarter of arrivals) to {last / 1000:.3g} s (last quarter)"
        )
    return True, ""


def _median(v: np.ndarray) -> float:
    return float(np.nanmedian(v)) if np.isfinite(v).any() else math.nan
