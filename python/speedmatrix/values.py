"""What counts as an absent value in a cell read back from run.json or a data frame: one
rule for the verdict and the report (a figure either side calls absent, the other does too)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["missing"]


def missing(v: Any) -> bool:
    """True for None, NaN (any float type, cells read back from a data frame), pandas' NA
    and an empty string."""
    if v is None:
        return True
    if isinstance(v, str):
        return v == ""
    if isinstance(v, (bool, int)):
        return False
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return type(v).__name__ == "NAType"  # pandas.NA, without importing pandas
