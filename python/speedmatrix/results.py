"""A saved run as an object: tidy frames for pandas work, the seed's matrix, records.

import speedmatrix as sm
run = sm.load("out/seed")
run.cells                      # one row per cell, every run.json field
run.table("total_tok_s")       # numbers: rows = context, columns = concurrency
run.status_table("total_tok_s") # the report's grid, with status text
run.requests                   # every request of every cell, times in ms from t0
run.tokens("decode-c8192-n4-r0")
sm.concat([run_a, run_b], ["before", "after"])

Over 500 lines: `Run` is one public object (frames, matrix, records) whose methods share
its caches; the derivations it uses live elsewhere (records, verdict, _core).
"""

from __future__ import annotations

import math
import os
import warnings
import zipfile
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speedmatrix import figures
from speedmatrix import slo as slo_mod
from speedmatrix.records import Records
from speedmatrix.runfile import load_records, read_run
from speedmatrix.units import format_tokens
from speedmatrix.verdict import combined_status

STATUS_TEXT = {
    "over_capacity": "Over capacity",
    "error": "Error",
    "queued": "Requests queued",
    "valid": "Valid",
}
NOT_MEASURED = "Not measured"
OUTCOME_TEXT = {0: "pending", 1: "ok", 2: "cancelled", 3: "error"}
PHASE_TEXT = {0: "warmup", 1: "window"}
CI_FIGURES = figures.CI_FIGURES
FIGURE_ALIASES = {
    "ttft": "ttft_ms",
    "tbt": "tbt_ms",
    "total": "total_tok_s",
    "per_request": "per_request_tok_s",
    "prompt": "prompt_tok_s",
    "active": "avg_active",
}
_MS = 1e6


def _context_label(c: int) -> str:
    return format_tokens(int(c))


def _flatten_cell(cell: dict) -> dict:
    row: dict[str, Any] = {}
    for k, v in cell.items():
        if k == "ci" and isinstance(v, dict):
            for fig, iv in v.items():
                lo, hi = iv if isinstance(iv, (list, tuple)) and len(iv) == 2 else (None, None)
                row[f"{fig}_lo"] = np.nan if lo is None else float(lo)
                row[f"{fig}_hi"] = np.nan if hi is None else float(hi)
        elif k == "server":
            for sk in ("running_mean", "running_max", "waiting_max", "kv_usage_max"):
                sv = v.get(sk) if isinstance(v, dict) else None
                row[f"server_{sk}"] = np.nan if sv is None else float(sv)
            for sk, sv in v.items() if isinstance(v, dict) else ():
                row.setdefault(f"server_{sk}", sv)
        elif k == "latency" and isinstance(v, dict):
            _flatten_latency(v, row)
        elif isinstance(v, dict) and k not in ("errors", "error_examples"):  # {kind: ...}
            for pk, pv in v.items():
                row[f"{k}_{pk}"] = pv
        else:
            row[k] = v
    row.setdefault(
        "id",
        f"{cell['phase']}-c{cell['context']}-n{cell['concurrency']}-r{cell.get('repetition', 0)}",
    )
    row.setdefault("repetition", 0)
    if not row.get("label"):
        row["label"] = _context_label(cell["context"])
    row.setdefault("flags", [])
    if row["flags"] is None:
        row["flags"] = []
    errs = row.get("errors") or {}
    row["errors"] = errs
    row.setdefault("errors_total", int(sum(errs.values())) if isinstance(errs, dict) else 0)
    return row


def _flatten_latency(latency: dict, row: dict) -> None:
    """run.json's latency distributions as columns: e2e_ms -> e2e_n, e2e_mean_ms, e2e_p99_ms,
    ... (the intervals stay in run.json). One name per figure (`figures`): the median is the
    p50; the TTFT distribution of completed requests is ``ttft_completed_*`` (``ttft_ms`` is
    over the requests sent); the TBT distribution's p50, p90 and p99 are the core's own
    ``tbt_ms``, ``tbt_p90_ms``, ``tbt_p99_ms`` (the same gaps) and are not written twice."""
    for name, dist in latency.items():
        if not isinstance(dist, dict):
            continue
        base = name.removesuffix("_ms")
        prefix = figures.DISTRIBUTION_PREFIX.get(base, base)
        for dk, dv in dist.items():
            if dk == "median" and "p50" not in dist:
                dk = "p50"
            if dk == "n":
                col = f"{prefix}_n"
            elif dk == "mean" or (dk.startswith("p") and dk[1:2].isdigit()):
                col = f"{prefix}_{dk}_ms"
            else:
                continue
            # a column the core writes (the TBT percentiles of the same gaps) is its own
            known = figures.find(col)
            if col == "tbt_p50_ms" or col in row or (known is not None and known.by == "core"):
                continue
            row[col] = np.nan if dv is None else dv


class Run:
    """One saved run (``DIR/run.json`` plus ``DIR/records``)."""

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

    # ---- metadata -------------------------------------------------------------------------
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

    # ---- frames ---------------------------------------------------------------------------
    @cached_property
    def all_cells(self) -> pd.DataFrame:
        """One row per cell, every run.json field as a column (`figures` names each), the
        columns a run did not measure included (all empty)."""
        rows = [_flatten_cell(c) for c in self.doc.get("cells") or []]
        df = pd.DataFrame(rows)
        if df.empty:
            df = pd.DataFrame(
                columns=["id", "phase", "context", "concurrency", "status", "label", "repetition"]
            )
        for fig in CI_FIGURES:
            for side in ("lo", "hi"):
                if f"{fig}_{side}" not in df:
                    df[f"{fig}_{side}"] = np.nan
        num = [
            "total_tok_s",
            "per_request_tok_s",
            "prompt_tok_s",
            "ttft_ms",
            "tbt_ms",
            "avg_active",
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
            if _flatten_cell(c)["id"] == cell_id:
                return c
        raise KeyError(f"no cell {cell_id!r} in this run")

    def records(self, cell_id: str) -> Records | None:
        """Raw records of a cell (`speedmatrix.records.Records`: ``requests``, ``events``,
        ``metrics`` and the cell's stamps; ``rec["requests"]`` works too), or None if not
        saved."""
        if cell_id in self._records_cache:
            return self._records_cache[cell_id]
        c = self.cell(cell_id)
        rel = c.get("records")
        rec = None
        if rel and self.path is not None and (self.path / rel).is_file():
            try:
                rec = Records.from_loaded(load_records(self.path, rel), c)
            except (OSError, ValueError, zipfile.BadZipFile) as exc:
                warnings.warn(
                    f"records of {cell_id} unreadable ({exc}); figures from run.json only",
                    stacklevel=2,
                )
        self._records_cache[cell_id] = rec
        return rec

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

    def _t0(self, cell: dict, rec: Records) -> int:
        if cell.get("t0_ns") is not None:
            return int(cell["t0_ns"])
        r = rec["requests"]
        if "sent_ns" in r and len(r["sent_ns"]):
            win = r["sent_ns"][(r.get("phase", np.ones(len(r["sent_ns"]))) == 1)]
            win = win[win >= 0]
            if len(win):
                return int(win.min())
            return int(r["sent_ns"][r["sent_ns"] >= 0].min())
        return 0

    def _request_frame(self, cell: dict, rec: Records) -> pd.DataFrame:
        r = rec["requests"]
        if not r:
            return pd.DataFrame()
        t0 = self._t0(cell, rec)
        n = len(next(iter(r.values())))
        df = pd.DataFrame({"request": np.arange(n)})
        cid = _flatten_cell(cell)["id"]
        df.insert(0, "cell", cid)
        for k, v in r.items():
            if k.endswith("_ns"):
                a = v.astype(np.int64)
                df[k[:-3] + "_ms"] = np.where(a >= 0, (a - t0) / _MS, np.nan)
            elif k == "phase":
                df["phase"] = [PHASE_TEXT.get(int(x), str(x)) for x in v]
            elif k == "outcome":
                df["outcome"] = [OUTCOME_TEXT.get(int(x), str(x)) for x in v]
            else:
                df[k] = v
        if {"first_token_ms", "sent_ms"} <= set(df):
            df["ttft_ms"] = df["first_token_ms"] - df["sent_ms"]
        if {"done_ms", "first_token_ms", "output_tokens"} <= set(df):
            dur = (df["done_ms"] - df["first_token_ms"]) / 1000
            toks = df["output_tokens"].astype(float) - 1
            df["tok_s"] = np.where((dur > 0) & (toks > 0), toks / dur, np.nan)
        df["context"] = cell["context"]
        df["concurrency"] = cell["concurrency"]
        df["cell_phase"] = cell["phase"]
        return df

    @cached_property
    def requests(self) -> pd.DataFrame:
        """Every saved request of every cell; ``*_ms`` columns are relative to the cell's t0."""
        frames = []
        for c in self.doc.get("cells") or []:
            cid = _flatten_cell(c)["id"]
            rec = self.records(cid)
            if rec is None:
                continue
            f = self._request_frame(c, rec)
            if not f.empty:
                frames.append(f)
        if not frames:
            return pd.DataFrame(
                columns=[
                    "cell",
                    "request",
                    "phase",
                    "sent_ms",
                    "first_token_ms",
                    "done_ms",
                    "ttft_ms",
                    "output_tokens",
                    "outcome",
                ]
            )
        return pd.concat(frames, ignore_index=True)

    def tokens(self, cell_id: str) -> pd.DataFrame:
        """Token arrivals of a cell (`_core.token_arrivals`: one delivery's events, a
        socket read or reads within 1 ms, are one arrival): request, ``t_ms`` from t0, tokens, gap per token (ms; NaN for a
        request's first arrival), ``in_window`` (a window request's arrival in [t0, t1])."""
        rec = self.records(cell_id)
        cols = ["request", "t_ms", "tokens", "gap_ms", "in_window"]
        if rec is None or not rec.has_events():
            return pd.DataFrame(columns=cols)
        cell = self.cell(cell_id)
        t0 = self._t0(cell, rec)
        a = rec.arrivals(phase=-1)
        t = a["t_ns"].astype(np.int64)
        req = a["request"].astype(np.int64)
        phase = np.asarray(rec.requests.get("phase", np.ones(len(rec.requests["sent_ns"]))))
        t1 = cell.get("t1_ns")
        inw = (phase[req] == 1) & (t >= t0) & ((t <= int(t1)) if t1 is not None else True)
        df = pd.DataFrame(
            {
                "request": req,
                "t_ms": (t - t0) / _MS,
                "tokens": a["tokens"].astype(np.int64),
                "gap_ms": a["gap_ms"],
                "in_window": inw,
            }
        )
        return df.sort_values("t_ms", kind="stable").reset_index(drop=True)

    def tbt_samples(self, cell_id: str) -> np.ndarray:
        """Per-token gaps (ms) inside the window, an arrival's gap once per token: the
        multiset whose median is the cell's ``tbt_ms`` (`Records.tbt_samples`)."""
        rec = self.records(cell_id)
        cell = self.cell(cell_id)
        if rec is None or not rec.has_events():
            return np.zeros(0)
        t0 = self._t0(cell, rec)
        t1 = cell.get("t1_ns")
        return rec.tbt_samples(t0, int(t1) if t1 is not None else np.iinfo(np.int64).max)

    def bins(self, cell_id: str, bin_s: float = 1.0) -> np.ndarray:
        """Output tok/s per ``bin_s`` bin of the window, as the cell's figures bin it (for
        plots and Welch tests; `Records.bins`)."""
        rec = self.records(cell_id)
        cell = self.cell(cell_id)
        if rec is None or not rec.has_events() or cell.get("t1_ns") is None:
            return np.zeros(0)
        return rec.bins(self._t0(cell, rec), int(cell["t1_ns"]), bin_s)

    def server_metrics(self, cell_id: str) -> pd.DataFrame:
        """The /metrics samples of a cell: ``t_ms`` from t0 and one column per metric."""
        rec = self.records(cell_id)
        if rec is None or not rec["metrics"]["names"]:
            return pd.DataFrame(columns=["t_ms"])
        m = rec["metrics"]
        t0 = self._t0(self.cell(cell_id), rec)
        df = pd.DataFrame(np.asarray(m["values"], float), columns=m["names"])
        df.insert(0, "t_ms", (np.asarray(m["t_ns"], np.int64) - t0) / _MS)
        return df

    # ---- the seed's tables ----------------------------------------------------------------
    def _decode(self) -> pd.DataFrame:
        df = self.all_cells
        return df[df["phase"] == "decode"] if "phase" in df else df

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
        import warnings as _warnings

        _warnings.warn(
            "Run.matrix() is deprecated: use Run.table(figure) for numbers or "
            "Run.status_table(figure) for the report's grid with status text",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._pivot(figure, numeric=numeric, aggregate=aggregate, all_cells=all_cells)

    def _pivot(
        self,
        figure: str = "total_tok_s",
        numeric: bool = False,
        aggregate: str = "median",
        all_cells: bool = False,
    ) -> pd.DataFrame:
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
        out = pd.DataFrame(
            index=pd.Index([labels[c] for c in contexts], name="context"),
            columns=pd.Index(conc, name=axis),
            dtype=float if numeric else object,
        )
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
        out = pd.DataFrame(
            index=pd.Index([labels[c] for c in contexts], name="context"),
            columns=pd.Index(loads, name="request_rate" if by_rate else "concurrency"),
            dtype=float if numeric else object,
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
        return {c: have.get(c) or _context_label(c) for c in contexts}

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
        out = pd.DataFrame(
            index=pd.Index([labels[c] for c in md["contexts"]], name="context"),
            columns=pd.Index(loads, name=axis),
            dtype=object,
        )
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
                    "label": sub["label"].iloc[0] if len(sub) else _context_label(c),
                    "status": combined_status(sub["status"].tolist()) if len(sub) else None,
                    "prompt_tok_s": float(use["prompt_tok_s"].median()) if len(use) else np.nan,
                    "ttft_ms": float(use["ttft_ms"].median()) if len(use) else np.nan,
                    "prompt_tok_s_lo": _safe_min(use, "prompt_tok_s_lo", "prompt_tok_s", len(use)),
                    "prompt_tok_s_hi": _safe_max(use, "prompt_tok_s_hi", "prompt_tok_s", len(use)),
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

    def __repr__(self) -> str:
        n = len(self.doc.get("cells") or [])
        extra = ", interrupted" if self.interrupted else ""
        return f"<speedmatrix Run {self.label!r}: {n} cells{extra} at {self.path}>"

    def _repr_html_(self) -> str:  # notebooks
        return f"<p>{self!r}</p>" + self.status_table("total_tok_s").to_html(na_rep="—")


def _display_float(x: float) -> str:
    """Four significant digits, no exponent below a million: display only."""
    if not math.isfinite(x):
        return str(x)
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return f"{x:.3e}"


class CellsFrame(pd.DataFrame):
    """`Run.cells`: a DataFrame whose text and notebook reprs, and those of the frames taken
    from it (``run.cells[["id", "tbt_ms"]]``), round floats to four significant digits
    (``116.7``, not ``116.666667``). Display only: the values are pandas' own."""

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return CellsFrame

    def __repr__(self) -> str:
        with pd.option_context("display.float_format", _display_float):
            return super().__repr__()

    def _repr_html_(self) -> str | None:
        with pd.option_context("display.float_format", _display_float):
            return super()._repr_html_()


def _safe_min(df: pd.DataFrame, col: str, fallback: str, n: int) -> float:
    if n == 0:
        return np.nan
    if col in df and df[col].notna().any():
        return float(df[col].min())
    return float(df[fallback].min()) if n > 1 else np.nan


def _safe_max(df: pd.DataFrame, col: str, fallback: str, n: int) -> float:
    if n == 0:
        return np.nan
    if col in df and df[col].notna().any():
        return float(df[col].max())
    return float(df[fallback].max()) if n > 1 else np.nan


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
        cid = _flatten_cell(c)["id"]
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
