"""`Run`, a saved run as one object, and `load`, which reads one from its folder; `concat`,
several runs' frames as one."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from speedmatrix.results.flatten import id_of_cell
from speedmatrix.results.tables import RunTables
from speedmatrix.runfile import read_run


class Run(RunTables):
    """One saved run (``DIR/run.json`` plus ``DIR/records``): frames (`RunBase`), records
    (`RunRecords`) and the seed's tables (`RunTables`)."""

    def recompute(self, rules: Any = None, **changes: Any) -> Run:
        """This run with every measured cell rebuilt from its records by
        `speedmatrix.verdict` (`speedmatrix.recompute.recompute_doc`): with the saved
        rules, other ``rules`` (a `speedmatrix.verdict.Rules`), or some thresholds changed
        (``error_threshold=0.1``). ``notes`` on the result says what had to be assumed."""
        from speedmatrix.recompute import recompute_doc

        if self.path is None:
            raise ValueError("recompute needs a run loaded from a folder (its records)")
        out = recompute_doc(self.doc, self.path, rules=rules, changes=changes or None)
        run = Run(out.doc, self.path, label=self._label)
        run.notes = out.notes
        run.changed = out.changed
        return run

    def __repr__(self) -> str:
        n = len(self.doc.get("cells") or [])
        extra = ", interrupted" if self.interrupted else ""
        return f"<speedmatrix Run {self.label!r}: {n} cells{extra} at {self.path}>"

    def _repr_html_(self) -> str:  # notebooks
        return f"<p>{self!r}</p>" + self.status_table("total_tok_s").to_html(na_rep="—")


def load(run_dir: str | os.PathLike, label: str | None = None, strict: bool = True) -> Run:
    """Load a saved run folder (``DIR/run.json`` and its records)."""
    p = Path(run_dir)
    doc = read_run(p, strict=strict)
    folder = p.parent if p.suffix == ".json" and p.is_file() else p
    return Run(doc, folder, label=label)


CONCAT_FRAMES = ("cells", "requests", "prefill", "tokens")


def _tokens_frame(run: Run) -> pd.DataFrame:
    """Token events of every cell with saved records: :meth:`Run.tokens` plus the cell's
    id, phase, context and concurrency."""
    parts = []
    for c in run.doc.get("cells") or []:
        cid = id_of_cell(c)
        df = run.tokens(cid)
        if len(df):
            parts.append(
                df.assign(
                    cell=cid,
                    cell_phase=c["phase"],
                    context=c["context"],
                    concurrency=c["concurrency"],
                )
            )
    cols = [
        "cell",
        "cell_phase",
        "context",
        "concurrency",
        "request",
        "t_ms",
        "tokens",
        "gap_ms",
        "in_window",
    ]
    if not parts:
        return pd.DataFrame(columns=cols)
    return pd.concat(parts, ignore_index=True)[cols]


def concat(
    runs: Iterable[Run], labels: Iterable[str] | None = None, frame: str = "cells"
) -> pd.DataFrame:
    """One frame of several runs' ``cells`` (or ``requests``, ``prefill``, ``tokens``: the
    token events of every cell) with a ``run`` column."""
    if frame not in CONCAT_FRAMES:
        raise ValueError(f"frame: {frame!r} is not one of {', '.join(CONCAT_FRAMES)}")
    runs = list(runs)
    labels = list(labels) if labels is not None else [r.label for r in runs]
    if len(labels) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(labels)} labels")
    if len(set(labels)) != len(labels):
        labels = [f"{lab} #{i + 1}" for i, lab in enumerate(labels)]
    frames = []
    for r, lab in zip(runs, labels):
        f = {"prefill": Run.prefill, "tokens": _tokens_frame}.get(
            frame, lambda run: getattr(run, frame)
        )(r)
        f = f.copy()
        f.insert(0, "run", lab)
        frames.append(f)
    if not frames:
        return pd.DataFrame(columns=["run"])
    out = pd.concat(frames, ignore_index=True)
    out["run"] = pd.Categorical(out["run"], categories=labels, ordered=True)
    return out
