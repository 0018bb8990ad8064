"""`run --plan sparse`: which cells to measure, and when to stop (issue 24).

A sparse run measures a small *design* of the closed-loop decode grid, fits the built-in
engine's profile to it (`speedmatrix.twin.fitrun`), predicts the cells it did not measure
(`speedmatrix.twin.model`) and then measures, one at a time, the unmeasured cell whose
prediction interval is widest relative to its value, refitting after each, until every
unmeasured cell's interval is within the target or the budget of measured cells is spent.

The design pins the step model's terms: the corners of contexts × concurrency (the smallest
and largest batch at the shortest and longest context: the KV term and the batch terms) and
the *knee* of the concurrency axis (the largest level the server runs at once, where the
batch stops growing; the axis' middle level when the limit is not known). Cells are
``(context, concurrency)`` pairs; the grid holds only the cells the plan can run (over
capacity ones are judged by the capacity rule, never predicted).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from speedmatrix.twin.model import PredictedCell, slot_passes

__all__ = [
    "DESIGN_MAX",
    "MIN_BUDGET",
    "Choice",
    "budget",
    "design",
    "knee",
    "next_cell",
    "relative_half_width",
]

Cell = tuple[int, int]

#: the most cells of the first design (issue 24: a fit from at most 10 measured cells)
DESIGN_MAX = 10
#: the share of the grid a sparse run measures at most unless told (issue 24: 40 % of the time)
BUDGET_SHARE = 0.4
#: the fewest decode cells a fit can use: three cells at two batch sizes, and one to check
MIN_BUDGET = 4


@dataclass(frozen=True)
class Choice:
    """The next cell to measure (None: stop) and why: ``widest`` (its interval is the
    widest, above the target), ``target`` (every interval within it), ``budget`` (the
    measured cells reached the budget) or ``done`` (no cell is left that measuring could
    narrow)."""

    cell: Cell | None
    why: str
    width: float = 0.0


def budget(grid_size: int, max_cells: int = 0) -> int:
    """The most decode cells a sparse run measures: ``max_cells`` when given, else 40 % of
    the grid, at least `MIN_BUDGET` (a grid that small is measured in full)."""
    if max_cells > 0:
        return min(max_cells, grid_size)
    return min(grid_size, max(MIN_BUDGET, math.floor(BUDGET_SHARE * grid_size)))


def knee(levels: Sequence[int], max_running: int | None) -> int | None:
    """The knee of the concurrency axis: the largest level at or under ``max_running`` when
    a larger level exists (beyond it requests queue and the batch stops growing), else the
    level at the axis' geometric middle; None when the axis has no level between its ends."""
    ordered = sorted(set(levels))
    if len(ordered) < 3:
        return None
    inner = ordered[1:-1]
    if max_running and ordered[-1] > max_running:
        under = [n for n in ordered if n <= max_running]
        if under and under[-1] in inner:
            return under[-1]
    return _nearest_middle(inner, ordered[0], ordered[-1])


def _nearest_middle(levels: Sequence[int], low: int, high: int) -> int:
    """The level nearest the geometric middle of ``low`` and ``high`` (ties: the lower)."""
    middle = math.sqrt(low * high)
    return min(levels, key=lambda n: (abs(math.log(n / middle)), n))


def design(
    grid: Iterable[Cell],
    max_running: int | None,
    most: int = DESIGN_MAX,
    family: str | None = None,
) -> list[Cell]:
    """The first cells of a sparse run, at most ``most``, in order of need: the shortest
    context's lowest level, the longest context's highest, the shortest's highest, the knee
    at the shortest (three batch sizes pin the batch terms, two contexts the KV term), the
    longest context's lowest level, the knee at the longest, then at the middle context.
    When the highest level is above ``max_running`` (it runs the knee's batch: two sizes
    only), the shortest's knee, then a level between its lowest and the knee.
    Of two levels that run the same batch at one context (the knee and a level above
    ``max_running``) only the first is kept. Levels whose step may take several passes
    (`slot_passes` of the capacity ``family``: llama.cpp's split slots partly busy) are left
    out: their step depends on slots the client cannot see, so they pin nothing."""
    slots = int(max_running or 0)
    cells = sorted(c for c in set(grid) if slot_passes(family, slots, c[1]) == 1)
    if not cells:
        return []
    contexts = sorted({c for c, _ in cells})
    levels_at = {c: sorted(n for cc, n in cells if cc == c) for c in contexts}
    k = knee(sorted({n for _, n in cells}), max_running)
    lo, hi = contexts[0], contexts[-1]
    lowest, highest = levels_at[lo][0], levels_at[lo][-1]
    wanted: list[Cell] = [(lo, lowest), (hi, levels_at[hi][-1])]
    between = _between(levels_at[lo], lowest, k)
    if k is not None and max_running and highest > max_running and between is not None:
        # the highest level runs the knee's batch: a level below the knee is the third size
        wanted += [(lo, k), (lo, between), (lo, highest)]
    else:
        wanted += [(lo, highest)] + ([(lo, k)] if k is not None else [])
    wanted.append((hi, levels_at[hi][0]))
    if k is not None:
        wanted += [(hi, k), (contexts[len(contexts) // 2], k)]
    out: list[Cell] = []
    batches: set[Cell] = set()
    for cell in wanted:
        # a level above max_running runs the knee's batch: one of the two per context
        batch = (cell[0], min(cell[1], slots) if slots else cell[1])
        if cell in cells and batch not in batches:
            out.append(cell)
            batches.add(batch)
    return out[:most]


def _between(levels: Sequence[int], low: int, knee_level: int | None) -> int | None:
    """The level strictly between ``low`` and the knee nearest their geometric middle."""
    if knee_level is None:
        return None
    inner = [n for n in levels if low < n < knee_level]
    return _nearest_middle(inner, low, knee_level) if inner else None


def relative_half_width(p: PredictedCell) -> float:
    """The widest relative half-width of ``p``'s intervals (total tok/s, time between
    tokens); 0 for a cell without figures (over capacity)."""
    widths = [0.0]
    for mid, low, high in (
        (p.total_tok_s, p.total_tok_s_low, p.total_tok_s_high),
        (p.tbt_ms, p.tbt_ms_low, p.tbt_ms_high),
    ):
        if mid is None or low is None or high is None or mid <= 0:
            continue
        widths.append((high - low) / 2 / mid)
    return max(widths)


def next_cell(
    predictions: Mapping[Cell, PredictedCell], measured: int, target: float, most: int
) -> Choice:
    """The stopping rule: ``predictions`` of the cells not measured; ``measured``: how many
    decode cells the run measured; stop when none is left, when the budget ``most`` is spent,
    or when every interval is within ``target``; else the widest (ties: the lower cell).
    A cell whose step may take several passes (``slot_passes``) is never chosen: its
    interval spans the server's slot assignment, which measuring it does not narrow."""
    predictions = {k: p for k, p in predictions.items() if p.slot_passes == 1}
    if not predictions:
        return Choice(None, "done")
    widths = {cell: relative_half_width(p) for cell, p in predictions.items()}
    cell = max(sorted(widths), key=lambda c: widths[c])
    if widths[cell] <= target:
        return Choice(None, "target", widths[cell])
    if measured >= most:
        return Choice(None, "budget", widths[cell])
    return Choice(cell, "widest", widths[cell])
