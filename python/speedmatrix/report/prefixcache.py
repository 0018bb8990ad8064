"""The report's prefix-cache view: per cell, the cached fraction asked against the one the
server delivered, and TTFT by cached fraction (a table and a chart). Shown only for runs
whose cells carry ``cached_fraction`` (`speedmatrix.prefixcache`); the numbers are the
cells' stored figures and flags, this module only arranges them."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from speedmatrix.report.chartstyle import STYLE, empty, new_figure
from speedmatrix.report.model import Section, chart_section

__all__ = ["CHART", "cache_cells", "prefix_cache_section", "ttft_by_cached_fraction"]

#: the chart's name in the report
CHART = "ttft_vs_cached_fraction"
_FLAG = "cache_hit_mismatch"


def cache_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells that asked for a cached fraction, by context, concurrency and fraction;
    empty when the run has no such cell."""
    if "cached_fraction" not in cells or cells["cached_fraction"].isna().all():
        return cells.iloc[0:0]
    rows = cells[cells["cached_fraction"].notna()]
    return rows.sort_values(["context", "concurrency", "cached_fraction"])


def _pct(value: Any) -> str:
    return "—" if value is None or pd.isna(value) else f"{100 * float(value):.1f}%"


_COLUMNS = ["Context", "Concurrency", "Cached asked", "Cached delivered", "TTFT ms", "Flag"]
_TEXT = (
    "Each request repeated the asked share of its prompt from a prefix the server had "
    "already seen; the delivered share is the server's own count (usage cached_tokens, "
    "llama.cpp timings or its counters). More than 5 points apart flags the cell. The "
    "decode matrix above shows the cells of the smallest share asked."
)


def _row(c: pd.Series) -> list[str]:
    flags = c.get("flags")
    mismatch = isinstance(flags, (list, tuple)) and _FLAG in flags
    ttft = c.get("ttft_ms")
    return [
        str(int(c["context"])),
        str(int(c["concurrency"])),
        _pct(c["cached_fraction"]),
        _pct(c.get("delivered_cached_fraction")),
        "—" if ttft is None or pd.isna(ttft) else f"{float(ttft):.1f}",
        "cache hit mismatch" if mismatch else "",
    ]


def prefix_cache_section(cells: pd.DataFrame) -> Section | None:
    """Requested vs delivered cached fraction and the median TTFT of each cell; None for a
    run without the axis."""
    rows = [_row(c) for _, c in cache_cells(cells).iterrows()]
    return chart_section("Prefix cache", "prefix-cache", CHART, _COLUMNS, rows, _TEXT)


def ttft_by_cached_fraction(cells: pd.DataFrame) -> Figure:
    """Median TTFT against the delivered cached fraction (the asked one where the server
    reported none), one line per context and concurrency."""
    rows = cache_cells(cells)
    with plt.rc_context(STYLE):
        fig, ax = new_figure()
        if rows.empty or rows["ttft_ms"].isna().all():
            empty(ax, "no TTFT measured")
            return fig
        for (ctx, n), group in rows.groupby(["context", "concurrency"]):
            x = group["delivered_cached_fraction"].fillna(group["cached_fraction"])
            y = group["ttft_ms"].to_numpy(float)
            ok = np.isfinite(y)
            ax.plot(100 * x.to_numpy(float)[ok], y[ok], marker="o", ms=3.5, label=f"C={ctx} N={n}")
        ax.set_xlabel("prompt served from the cache (%)")
        ax.set_ylabel("TTFT (ms, median)")
        ax.set_title("Time to first token by cached fraction")
        ax.legend(fontsize=7.5, ncols=2)
    return fig
