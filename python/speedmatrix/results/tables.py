"""`RunTables`: a run's decode cells in the matrix layout (context x load) as numbers or
with status text, its prefill per context, its capacity at an SLO and its missing cells."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from speedmatrix import figures
from speedmatrix import slo as slo_mod
from speedmatrix.results.flatten import FIGURE_ALIASES, NOT_MEASURED, STATUS_TEXT, context_label
from speedmatrix.results.recorded import RunRecords
from speedmatrix.verdict import combined_status


class RunTables(RunRecords):
    """The seed's tables of a run."""

    def _decode(self) -> pd.DataFrame:
        """The decode grid's cells; of a cached-fraction run, those of its smallest share
        (the others are the report's Prefix cache view), never a median across shares."""
        df = self.all_cells
        df = df[df["phase"] == "decode"] if "phase" in df else df
        if "cached_fraction" in df and df["cached_fraction"].notna().any():
            df = df[df["cached_fraction"] == df["cached_fraction"].min()]
        return df

    def table(
        self, figure: str = "total_tok_s", aggregate: str = "median", all_cells: bool = False
    ) -> pd.DataFrame:
        """A decode figure as a numeric (float) context × load table: rows = context label in
        context order, columns = concurrency (request rate in a request-rate run). Only valid and queued cells give a
        number; over-capacity, error and unreached cells are NaN (see :meth:`status_table`
        for the same layout with their status text). Plots and styles directly:
        ``run.table("total_tok_s").style.background_gradient()``."""
        return self._pivot(figure, numeric=True, aggregate=aggregate, all_cells=all_cells)

    def status_table(
        self, figure: str = "total_tok_s", aggregate: str = "median", all_cells: bool = False
    ) -> pd.DataFrame:
        """The report's grid as a frame (object dtype): a figure where the cell is valid or
        queued, else the status text ("Over capacity", "Error", "Not measured")."""
        return self._pivot(figure, numeric=False, aggregate=aggregate, all_cells=all_cells)

    def matrix(
        self,
        figure: str = "total_tok_s",
        numeric: bool = False,
        aggregate: str = "median",
        all_cells: bool = False,
    ) -> pd.DataFrame:
        """Deprecated: :meth:`table` (``numeric=True``) or :meth:`status_table`. "Matrix"
        names the matrix definition (:attr:`matrix_definition`, :class:`speedmatrix.Matrix`)."""
        warnings.warn(
            "Run.matrix() is deprecated: use Run.table(figure) for numbers or "
            "Run.status_table(figure) for the report's grid with status text",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._pivot(figure, numeric=numeric, aggregate=aggregate, all_cells=all_cells)

    def _pivot(self, figure: str, numeric: bool, aggregate: str, all_cells: bool) -> pd.DataFrame:
        """Decode cells pivoted: rows = context label (context order), columns = the load
        (:meth:`_load_axis`: concurrency, or request rate in a request-rate run).

        As in the report's matrix, only valid and queued cells give numbers: a cell
        whose (combined) status is over capacity or error holds its status text
        ("Over capacity", "Error"), and a cell an interrupted run never reached
        "Not measured" (figures an error cell did compute are not to be compared
        with the others). With ``numeric=True`` those are NaN. Repetitions are
        combined by ``aggregate`` (median by default) over their valid and queued
        repetitions. ``all_cells=True`` takes the numbers of every cell whatever its
        status (counts such as ``errors_total``).
        """
        figure = FIGURE_ALIASES.get(figure, figure)
        figure = figures.RENAMED.get(figure, figure)
        dec = self._decode()
        md = self.matrix_definition
        contexts = md["contexts"]
        _, conc, axis = self._load_axis()
        if figure not in dec.columns and not dec.empty:
            raise KeyError(f"no figure {figure!r} in the cells (have: {sorted(dec.columns)})")
        labels = self._labels(dec, contexts)
        out = _grid([labels[c] for c in contexts], conc, axis, float if numeric else object)
        groups = self._groups(dec)
        for i, c in enumerate(contexts):
            for j, n in enumerate(conc):
                val: Any = np.nan
                sub = groups.get((c, n))
                if sub is not None:
                    st = combined_status(sub["status"].tolist())
                    if not all_cells:
                        sub = sub[sub["status"].isin(("valid", "queued"))]
                    nums = pd.to_numeric(sub[figure], errors="coerce").dropna()
                    if len(nums) and (all_cells or st in ("valid", "queued")):
                        val = float(getattr(nums, aggregate)())
                    elif not numeric:
                        val = STATUS_TEXT.get(st, st) if st != "valid" else np.nan
                elif not numeric:
                    val = NOT_MEASURED
                out.iat[i, j] = val
        return out

    def load_matrix(self, figure: str = "slo_goodput_req_s", numeric: bool = False) -> pd.DataFrame:
        """Decode cells pivoted by their load: rows = context label, columns = request rate
        for a request-rate run (``rate_per_s``), else concurrency. For the open-loop, latency
        and SLO figures (``slo_attainment``, ``slo_goodput_req_s``, ``slo_goodput_tok_s``,
        ``open_loop_achieved_rate_per_s``, ``e2e_p99_ms``, ...; see `cells`), which
        `matrix` cannot place in a rate run. Repetitions: the median over valid and queued
        ones; other cells hold their status text (NaN with ``numeric=True``)."""
        figure = figures.RENAMED.get(figure, figure)
        dec = self._decode()
        if dec.empty:
            return pd.DataFrame()
        if figure not in dec.columns:
            raise KeyError(f"no figure {figure!r} in the cells (have: {sorted(dec.columns)})")
        by_rate = "rate_per_s" in dec and dec["rate_per_s"].notna().any()
        key = "rate_per_s" if by_rate else "concurrency"
        dec = dec[dec[key].notna()]
        contexts = sorted({int(c) for c in dec["context"]})
        loads = sorted({float(x) if by_rate else int(x) for x in dec[key]})
        labels = self._labels(dec, contexts)
        out = _grid(
            [labels[c] for c in contexts],
            loads,
            "request_rate" if by_rate else "concurrency",
            float if numeric else object,
        )
        for (c, x), sub in dec.groupby(["context", key]):
            st = combined_status(sub["status"].tolist())
            ok = sub[sub["status"].isin(("valid", "queued"))]
            nums = pd.to_numeric(ok[figure], errors="coerce").dropna()
            if len(nums):
                val: Any = float(nums.median())
            else:
                val = np.nan if numeric else STATUS_TEXT.get(st, st)
            out.loc[labels[int(c)], float(x) if by_rate else int(x)] = val
        return out

    @staticmethod
    def _labels(dec: pd.DataFrame, contexts: list[int]) -> dict[int, str]:
        have = dict(zip(dec["context"], dec["label"])) if len(dec) else {}
        return {c: have.get(c) or context_label(c) for c in contexts}

    def _load_axis(self) -> tuple[str, list, str]:
        """The matrix's load axis: (cell column, the loads in matrix order, axis name):
        request rates for a request-rate run (open loop), else concurrency."""
        md = self.matrix_definition
        rates = md.get("request_rates") or []
        if rates:
            return "rate_per_s", [float(r) for r in rates], "request_rate"
        return "concurrency", list(md["concurrency"]), "concurrency"

    def _groups(self, dec: pd.DataFrame) -> dict[tuple[int, Any], pd.DataFrame]:
        key, _, _ = self._load_axis()
        if dec.empty or key not in dec:
            return {}
        load = float if key == "rate_per_s" else int
        dec = dec[dec[key].notna()]
        return {(int(k[0]), load(k[1])): g for k, g in dec.groupby(["context", key])}

    def statuses(self) -> pd.DataFrame:
        """The status of each decode cell in the matrix layout (``None`` = not measured)."""
        dec = self._decode()
        md = self.matrix_definition
        _, loads, axis = self._load_axis()
        labels = self._labels(dec, md["contexts"])
        out = _grid([labels[c] for c in md["contexts"]], loads, axis, object)
        groups = self._groups(dec)
        for i, c in enumerate(md["contexts"]):
            for j, n in enumerate(loads):
                sub = groups.get((c, n))
                out.iat[i, j] = None if sub is None else combined_status(sub["status"].tolist())
        return out

    def prefill(self) -> pd.DataFrame:
        """Prefill figures per context (median over repetitions), in context order."""
        df = self.all_cells
        pre = df[df["phase"] == "prefill"] if "phase" in df else df
        rows = []
        for c in self.matrix_definition["prefill_contexts"]:
            sub = pre[pre["context"] == c]
            ok = sub[sub["status"].isin(["valid", "queued"])]
            use = ok if len(ok) else sub
            rows.append(
                {
                    "context": c,
                    "label": sub["label"].iloc[0] if len(sub) else context_label(c),
                    "status": combined_status(sub["status"].tolist()) if len(sub) else None,
                    "prompt_tok_s": float(use["prompt_tok_s"].median()) if len(use) else np.nan,
                    "ttft_ms": float(use["ttft_ms"].median()) if len(use) else np.nan,
                    "prompt_tok_s_lo": _bound(
                        use, "prompt_tok_s_lo", "prompt_tok_s", len(use), "min"
                    ),
                    "prompt_tok_s_hi": _bound(
                        use, "prompt_tok_s_hi", "prompt_tok_s", len(use), "max"
                    ),
                    "repetitions": len(sub),
                }
            )
        return pd.DataFrame(
            rows,
            columns=[
                "context",
                "label",
                "status",
                "prompt_tok_s",
                "ttft_ms",
                "prompt_tok_s_lo",
                "prompt_tok_s_hi",
                "repetitions",
            ],
        )

    def capacity(
        self, slo: str | dict, attainment: str | float = slo_mod.DEFAULT_ATTAINMENT
    ) -> dict[int, dict]:
        """The capacity answer per decode context: the largest measured concurrency (or
        rate, for a request-rate run) whose requests meet ``slo`` (``"ttft=2s,tpot=50ms"``
        or ``{"ttft": 2000.0}`` in ms) at ``attainment`` (0.95 or ``"95%"``), the first that
        does not, and an interpolated estimate with its method (`speedmatrix.slo.capacity`).
        Every cell is judged from its own records, so any SLO can be asked of a saved run."""

        targets = slo_mod.parse_slo(slo) if isinstance(slo, str) else dict(slo)
        share = (
            slo_mod.parse_attainment(attainment)
            if isinstance(attainment, str)
            else float(attainment)
        )

        def records(cell_id: str):
            rec = self.records(cell_id)
            return None if rec is None else (rec.requests, rec.events)

        return slo_mod.run_capacity(self.doc.get("cells") or [], records, targets, share)

    def missing_cells(self) -> list[tuple[str, int, Any]]:
        """(phase, context, load) of the matrix that have no cell (interrupted runs); the load
        is the concurrency, or the request rate in a request-rate run (prefill: 1). A search
        run's decode cells are never missing: it measures only the loads it needs."""
        md = self.matrix_definition
        key, loads, _ = self._load_axis()

        def load(c: dict) -> Any:
            if c["phase"] == "decode" and key == "rate_per_s":
                return None if c.get(key) is None else float(c[key])
            return c["concurrency"]

        have = {(c["phase"], c["context"], load(c)) for c in self.doc.get("cells") or []}
        want: list[tuple[str, int, Any]] = [("prefill", c, 1) for c in md["prefill_contexts"]]
        if not md["search"]:  # a search measures only the loads it needs
            want += [("decode", c, n) for c in md["contexts"] for n in loads]
        return [w for w in want if w not in have]


def _grid(rows: list[str], loads: list, axis: str, dtype: Any) -> pd.DataFrame:
    """An empty context x load table: rows named ``context``, columns the load ``axis``."""
    return pd.DataFrame(
        index=pd.Index(rows, name="context"), columns=pd.Index(loads, name=axis), dtype=dtype
    )


def _bound(df: pd.DataFrame, col: str, fallback: str, n: int, side: str) -> float:
    """The ``side`` ("min" or "max") of an interval bound over repetitions: of ``col`` (the
    cells' own bounds) where any is known, else of the figure itself over two or more."""
    if n == 0:
        return np.nan
    if col in df and df[col].notna().any():
        return float(getattr(df[col], side)())
    return float(getattr(df[fallback], side)()) if n > 1 else np.nan
