"""A sweep's sparse plan (`Matrix.plan == "sparse"`, `speedmatrix.twin.sparse`): the
design measured first, then one cell at a time chosen from a fit to what the run measured
so far, and at the end the cells left unmeasured stored as predicted (``predicted: true``,
``*_low``/``*_high``; nothing in them was measured).

`SparseRun` works on the run folder as saved after each cell: the fit reads its raw
records (`speedmatrix.twin.fitrun.fit`), as `speedmatrix fit` would. A fit that fails (a
design whose cells failed, a server that does not say its KV pool) is said in one line and
the run measures every cell left, as a full plan: a cell is never predicted from nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from speedmatrix.twin.fitrun import fit
from speedmatrix.twin.model import PredictedCell, ProfileError, predict_cell
from speedmatrix.twin.predictrun import LIMITS, predicted_cell
from speedmatrix.twin.sparse import Choice, budget, design, next_cell

__all__ = ["SparseRun", "closed_loop_decode"]


def closed_loop_decode(cell: Any) -> bool:
    """A planned cell a sparse plan may predict: closed-loop decode, runnable."""
    return cell.phase == "decode" and cell.rate_per_s is None and bool(cell.runnable)


class SparseRun:
    """The order of a sparse run's decode cells. ``grid``: the planned closed-loop decode
    cells the plan can run; ``done``: ids of those already measured (a resumed run);
    ``family``: the server's capacity family (`speedmatrix.capacity`), whose slots may split
    a step (`speedmatrix.twin.model.slot_passes`)."""

    def __init__(
        self,
        grid: Sequence[Any],
        done: set[str],
        matrix: Any,
        out: Path,
        max_running: int | None,
        say: Callable[[str], None],
        family: str | None = None,
    ) -> None:
        self.by_key = {(int(c.context), int(c.concurrency)): c for c in grid}
        self.measured = {k for k, c in self.by_key.items() if c.id in done}
        self.matrix = matrix
        self.out = out
        self.say = say
        self.most = budget(len(self.by_key), int(matrix.sparse_max_cells))
        first = design(self.by_key, max_running, min(self.most, 10), family)
        self.first = [self.by_key[k] for k in first if k not in self.measured]
        self.profile: dict[str, Any] | None = None
        self.failed: str | None = None
        self.stopped = ""
        self.chosen: list[str] = []

    def held(self) -> set[str]:
        """Ids of the grid's cells outside the design: measured only when chosen."""
        first = {c.id for c in self.first}
        return {
            c.id for k, c in self.by_key.items() if k not in self.measured and c.id not in first
        }

    def mark(self, cell: Any, ok: bool) -> None:
        """``cell`` was measured (``ok``: its status is valid or queued)."""
        key = (int(cell.context), int(cell.concurrency))
        if key in self.by_key and ok:
            self.measured.add(key)

    def _refit(self) -> bool:
        try:
            self.profile = fit(self.out)
        except (ProfileError, ValueError, KeyError) as exc:
            self.failed = str(exc)
            return False
        return True

    def predictions(self, profile: dict[str, Any]) -> dict[tuple[int, int], PredictedCell]:
        m = self.matrix
        return {
            k: predict_cell(
                profile, k[0], k[1], max_output=int(m.max_output), window_s=float(m.duration_s)
            )
            for k in self.by_key
            if k not in self.measured
        }

    def next(self, tried: set[str]) -> Any:
        """The next planned cell to measure after the design, or None: refit, predict, and
        the widest interval above the target; after a failed fit every cell left in turn.
        ``tried``: ids already measured (or attempted) this run."""
        left = [c for k, c in self.by_key.items() if k not in self.measured and c.id not in tried]
        if self.failed is None and not self._refit():
            self.say(
                f"speedmatrix: sparse plan: the fit failed ({self.failed}); measuring the "
                f"{len(left)} cell(s) left"
            )
        if self.failed is not None:
            return left[0] if left else None
        assert self.profile is not None
        pred = {
            k: p
            for k, p in self.predictions(self.profile).items()
            if self.by_key[k].id not in tried
        }
        spent = len(self.by_key) - len(left)  # failed cells count against the budget too
        choice: Choice = next_cell(pred, spent, float(self.matrix.sparse_target), self.most)
        if choice.cell is None:
            self.stopped = choice.why
            self.say(
                f"speedmatrix: sparse plan: {len(self.measured)} of {len(self.by_key)} decode "
                f"cells measured; stopped ({choice.why}, widest interval ±{choice.width:.1%})"
            )
            return None
        self.chosen.append(self.by_key[choice.cell].id)
        return self.by_key[choice.cell]

    def predicted_cells(self, tried: set[str]) -> list[dict[str, Any]]:
        """The run.json cells of the grid's cells not measured, predicted from the last fit;
        [] when there is no fit (they stay unmeasured)."""
        if self.profile is None or self.failed is not None:
            return []
        out = []
        max_running = int(self.profile.get("max_running", 1 << 30))
        window_s = float(self.matrix.duration_s)
        for k, p in self.predictions(self.profile).items():
            planned = self.by_key[k]
            if planned.id in tried:
                continue
            cell = predicted_cell(p, max_running, window_s)
            cell.update(id=planned.id, label=planned.label, repetition=planned.repetition)
            out.append(cell)
        return out

    def meta(self) -> dict[str, Any]:
        """What ``meta.run.sparse`` and ``meta.run.prediction`` say of the plan."""
        fit_section = (self.profile or {}).get("fit") or {}
        return {
            "sparse": {
                "target": float(self.matrix.sparse_target),
                "budget": self.most,
                "design": [c.id for c in self.first],
                "chosen": list(self.chosen),
                "measured": len(self.measured),
                "grid": len(self.by_key),
                "stopped": self.stopped or ("fit failed" if self.failed else ""),
                "fit_error": self.failed,
            },
            "prediction": {
                "profile": "fitted by run --plan sparse",
                "fitted_to": str(self.out),
                "fitted_cells": list(fit_section.get("cells") or []),
                "limits": LIMITS,
                "model": "docs/metrics.md, Predicted cells",
            },
        }
