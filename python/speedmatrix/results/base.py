"""`RunBase`: a saved run's document, metadata, matrix definition and its cells as frames
(`Run` adds records and tables in `recorded` and `tables`)."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from speedmatrix import figures
from speedmatrix.records import Records
from speedmatrix.results.flatten import CI_FIGURES, flatten_cell, id_of_cell
from speedmatrix.results.frames import CellsFrame
from speedmatrix.runfile import CELL_FIGURES


class RunBase:
    """One saved run (``DIR/run.json`` plus ``DIR/records``): its cells."""

    def __init__(
        self, doc: dict, path: str | os.PathLike | None = None, label: str | None = None
    ) -> None:
        self.doc = doc
        self.path = Path(path) if path is not None else None
        self.meta: dict = doc.get("meta") or {}
        self._label = label
        self._records_cache: dict[str, Records | None] = {}
        #: set by `recompute`: what it had to assume, and the cells whose stored form changed
        self.notes: list[str] = []
        self.changed: list[str] = []

    @property
    def label(self) -> str:
        if self._label:
            return self._label
        eng = self.meta.get("engine") or {}
        if eng.get("name") or eng.get("version"):
            return " ".join(str(x) for x in (eng.get("name"), eng.get("version")) if x)
        return self.path.name if self.path else "run"

    @property
    def interrupted(self) -> bool:
        return bool((self.meta.get("run") or {}).get("interrupted"))

    @property
    def matrix_definition(self) -> dict:
        """Contexts, concurrency levels, request rates (a request-rate run; else empty) and
        prefill contexts, in tokens: from the plan the
        sweep resolved against the server (meta.run.plan: "max" as a token count, saved
        before the first cell, so an interrupted run keeps its whole matrix), else from the
        matrix definition (keywords it cannot resolve are dropped), always with the cells'
        own values added."""
        run = self.meta.get("run") or {}
        m = dict(run.get("matrix") or {})
        plan = run.get("plan") or {}
        m.update(
            {k: plan[k] for k in ("contexts", "concurrency", "prefill_contexts") if plan.get(k)}
        )
        cells = self.doc.get("cells") or []
        dec = [c for c in cells if c["phase"] == "decode"]
        pre = [c for c in cells if c["phase"] == "prefill"]

        def ints(v):
            out = []
            for x in v or []:
                try:
                    out.append(int(x))
                except (TypeError, ValueError):
                    continue
            return out

        contexts = ints(m.get("contexts")) or sorted({c["context"] for c in dec})
        conc = ints(m.get("concurrency") or m.get("concurrencies")) or sorted(
            {c["concurrency"] for c in dec}
        )
        pcs = ints(m.get("prefill_contexts")) or sorted({c["context"] for c in pre})
        # cells may hold resolved values ("max") not in the definition
        contexts = sorted(set(contexts) | {c["context"] for c in dec})
        conc = sorted(set(conc) | {c["concurrency"] for c in dec})
        pcs = sorted(set(pcs) | {c["context"] for c in pre})
        rates: set[float] = set()
        for r in m.get("request_rates") or []:
            try:
                rates.add(float(r))
            except (TypeError, ValueError):
                continue
        rates |= {float(c["rate_per_s"]) for c in dec if c.get("rate_per_s") is not None}
        return {
            "contexts": contexts,
            "concurrency": conc,
            "request_rates": sorted(rates),
            "prefill_contexts": pcs,
            "search": bool(m.get("search")),
        }

    @cached_property
    def all_cells(self) -> pd.DataFrame:
        """One row per cell, every run.json field as a column (`figures` names each), the
        columns a run did not measure included (all empty)."""
        rows = [flatten_cell(c) for c in self.doc.get("cells") or []]
        df = pd.DataFrame(rows)
        if df.empty:
            df = pd.DataFrame(
                columns=["id", "phase", "context", "concurrency", "status", "label", "repetition"]
            )
        for fig in CI_FIGURES:
            for side in ("lo", "hi"):
                if f"{fig}_{side}" not in df:
                    df[f"{fig}_{side}"] = np.nan
        num = [  # the cell contract's figures and others a cell may hold null: floats
            *CELL_FIGURES,
            "measured_s",
            "ttft_p90_ms",
            "ttft_p99_ms",
            "tbt_p90_ms",
            "tbt_p99_ms",
            "drift",
        ]
        for col in num:
            if col in df:
                df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
        return CellsFrame(df)

    @cached_property
    def cells(self) -> pd.DataFrame:
        """One row per cell, a column per figure (`figures.find` says what each is), less
        the columns of what this run did not measure: a column of the latency
        distributions, the open loop or the SLO (`figures.OPTIONAL_GROUPS`) that is empty in
        every cell (a plain closed-loop run has no SLO, no open loop). `all_cells` keeps
        them. Floats print rounded (display only: the values are as stored)."""
        df = self.all_cells
        drop = [
            col
            for col in df.columns
            if (f := figures.find(str(col))) is not None
            and f.group in figures.OPTIONAL_GROUPS
            and df[col].isna().all()
        ]
        return CellsFrame(df.drop(columns=drop))

    def cell(self, cell_id: str) -> dict:
        for c in self.doc.get("cells") or []:
            if id_of_cell(c) == cell_id:
                return c
        raise KeyError(f"no cell {cell_id!r} in this run")
