"""The matrix fields of `run --plan sparse` (issue 24): ``plan`` (``full`` measures every
cell; ``sparse`` measures a small design, fits the built-in engine's profile to it and
predicts the rest, `speedmatrix.twin.sparse`), ``sparse_target`` (the widest relative
half-width of a prediction interval left unmeasured) and ``sparse_max_cells`` (the most
decode cells measured; 0 = 40 % of the grid). `speedmatrix.matrix.Matrix` holds the
fields and calls `coerce` and `problems`.

A sparse plan predicts closed-loop decode cells only: it is refused beside request rates,
a search, a workload file, repetitions or a traffic shape, in one line naming both.
"""

from __future__ import annotations

import math
from typing import Any

from speedmatrix import trafficaxes

__all__ = ["PLANS", "coerce", "problems"]

PLANS = ("full", "sparse")


def coerce(m: Any) -> None:
    """The forms people type (``"Sparse"``, ``"10%"``) into the fields' types, in place."""
    if isinstance(m.plan, str):
        m.plan = m.plan.strip().lower()
    if isinstance(m.sparse_target, str):
        text = m.sparse_target.strip()
        try:
            m.sparse_target = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            pass  # kept for problems()


def problems(m: Any) -> list[str]:
    """Every problem of the plan fields, one message each, starting with the field."""
    errors: list[str] = []
    if m.plan not in PLANS:
        errors.append(f"plan: {m.plan!r} is not one of {', '.join(PLANS)}")
    target = m.sparse_target
    number = isinstance(target, (int, float)) and not isinstance(target, bool)
    if not number or not math.isfinite(target) or not 0 < target < 1:
        errors.append(f"sparse_target: {target!r} is not a fraction in (0, 1), e.g. 0.10")
    cap = m.sparse_max_cells
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        errors.append(f"sparse_max_cells: {cap!r} is not 0 (40 % of the grid) or a count")
    if m.plan == "sparse":
        others = trafficaxes.load_modes(m)
        if m.repetitions != 1:
            others.append("repetitions")
        if trafficaxes.kind(m):
            others.append(trafficaxes.kind(m))
        if others:
            errors.append(f"plan: sparse predicts closed-loop cells; not with {others[0]}")
    return errors
