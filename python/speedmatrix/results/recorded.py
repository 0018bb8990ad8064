"""`RunRecords`: a saved run's raw records per cell and the frames made from them
(requests, token arrivals, per-token gaps, throughput bins, /metrics samples)."""

from __future__ import annotations

import warnings
import zipfile
from functools import cached_property

import numpy as np
import pandas as pd

from speedmatrix.records import Records
from speedmatrix.results.base import RunBase
from speedmatrix.results.flatten import id_of_cell
from speedmatrix.results.frames import NS_PER_MS, cell_t0, request_frame
from speedmatrix.runfile import load_records


class RunRecords(RunBase):
    """The records of a run's cells."""

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

    @cached_property
    def requests(self) -> pd.DataFrame:
        """Every saved request of every cell; ``*_ms`` columns are relative to the cell's t0."""
        frames = []
        for c in self.doc.get("cells") or []:
            cid = id_of_cell(c)
            rec = self.records(cid)
            if rec is None:
                continue
            f = request_frame(c, rec)
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
        t0 = cell_t0(cell, rec)
        a = rec.arrivals(phase=-1)
        t = a["t_ns"].astype(np.int64)
        req = a["request"].astype(np.int64)
        phase = np.asarray(rec.requests.get("phase", np.ones(len(rec.requests["sent_ns"]))))
        t1 = cell.get("t1_ns")
        inw = (phase[req] == 1) & (t >= t0) & ((t <= int(t1)) if t1 is not None else True)
        df = pd.DataFrame(
            {
                "request": req,
                "t_ms": (t - t0) / NS_PER_MS,
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
        t0 = cell_t0(cell, rec)
        t1 = cell.get("t1_ns")
        return rec.tbt_samples(t0, int(t1) if t1 is not None else np.iinfo(np.int64).max)

    def bins(self, cell_id: str, bin_s: float = 1.0) -> np.ndarray:
        """Output tok/s per ``bin_s`` bin of the window, as the cell's figures bin it (for
        plots and Welch tests; `Records.bins`)."""
        rec = self.records(cell_id)
        cell = self.cell(cell_id)
        if rec is None or not rec.has_events() or cell.get("t1_ns") is None:
            return np.zeros(0)
        return rec.bins(cell_t0(cell, rec), int(cell["t1_ns"]), bin_s)

    def server_metrics(self, cell_id: str) -> pd.DataFrame:
        """The /metrics samples of a cell: ``t_ms`` from t0 and one column per metric."""
        rec = self.records(cell_id)
        if rec is None or not rec["metrics"]["names"]:
            return pd.DataFrame(columns=["t_ms"])
        m = rec["metrics"]
        t0 = cell_t0(self.cell(cell_id), rec)
        df = pd.DataFrame(np.asarray(m["values"], float), columns=m["names"])
        df.insert(0, "t_ms", (np.asarray(m["t_ns"], np.int64) - t0) / NS_PER_MS)
        return df
