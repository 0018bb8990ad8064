"""Frames of a run's records (requests, times in ms from the cell's t0) and the display of
`Run.cells` (floats rounded on screen only)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from speedmatrix.records import Records
from speedmatrix.results.flatten import OUTCOME_TEXT, PHASE_TEXT, id_of_cell

#: nanoseconds per millisecond
NS_PER_MS = 1e6


def cell_t0(cell: dict, rec: Records) -> int:
    """The cell's t0 (ns): saved, else its first window request's send time, else its first
    request's."""
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


def request_frame(cell: dict, rec: Records) -> pd.DataFrame:
    """The requests of one cell, one row each: ``*_ns`` stamps as ``*_ms`` from its t0, codes
    as text, ``ttft_ms`` and ``tok_s`` derived, the cell's context, concurrency and phase."""
    r = rec["requests"]
    if not r:
        return pd.DataFrame()
    t0 = cell_t0(cell, rec)
    n = len(next(iter(r.values())))
    df = pd.DataFrame({"request": np.arange(n)})
    cid = id_of_cell(cell)
    df.insert(0, "cell", cid)
    for k, v in r.items():
        if k.endswith("_ns"):
            a = v.astype(np.int64)
            df[k[:-3] + "_ms"] = np.where(a >= 0, (a - t0) / NS_PER_MS, np.nan)
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
