"""The report's reasoning view: per decode cell, time to first byte, first token (any
channel) and first content token side by side, the reasoning tokens' share of the output and
the `reasoning_hidden` flag (a table), and the three times by cell (a chart). Shown only for
runs with a cell whose server reported or streamed reasoning (`speedmatrix.reasoning`); the
numbers are the cells' stored figures and flags, this module only arranges them."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from speedmatrix.report.chartstyle import STYLE, empty, new_figure
from speedmatrix.report.model import Section, chart_section

__all__ = ["CHART", "first_output_times", "reasoning_cells", "reasoning_section"]

#: the chart's name in the report
CHART = "first_output_times"
_FLAG = "reasoning_hidden"
#: the three times, in the order a request meets them
_TIMES = (("ttfb_ms", "first byte"), ("ttft_ms", "first token"), ("ttfo_ms", "first content"))


def reasoning_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The decode cells with reasoning figures, by context and concurrency; empty when no
    cell of the run reported or streamed reasoning."""
    if "reasoning_share" not in cells or cells["reasoning_share"].isna().all():
        return cells.iloc[0:0]
    rows = cells[(cells["phase"] == "decode") & cells["reasoning_share"].notna()]
    return rows.sort_values(["context", "concurrency"], kind="stable")


def _ms(value: Any) -> str:
    return "—" if value is None or pd.isna(value) else f"{float(value):.1f}"


def _hidden(c: pd.Series) -> bool:
    flags = c.get("flags")
    return isinstance(flags, (list, tuple)) and _FLAG in flags


def _row(c: pd.Series) -> list[str]:
    tokens = c.get("reasoning_tokens")
    return [
        str(int(c["context"])),
        str(int(c["concurrency"])),
        *(_ms(c.get(k)) for k, _ in _TIMES),
        f"{100 * float(c['reasoning_share']):.1f}%",
        "—" if tokens is None or pd.isna(tokens) else str(int(tokens)),
        "reasoning hidden" if _hidden(c) else "",
    ]


_COLUMNS = [
    "Context",
    "Concurrency",
    "TTFB ms",
    "TTFT ms",
    "TTFO ms",
    "Reasoning",
    "Tokens",
    "Flag",
]
_TEXT = (
    "TTFT is the first token on any channel, reasoning included; TTFO the first token of "
    "the answer itself. Reasoning tokens are output tokens: throughput counts them. A "
    "server that reported reasoning it never streamed is flagged: its thinking is silence "
    "before the first visible chunk, and TTFT and per-request speed read it as waiting."
)


def reasoning_section(cells: pd.DataFrame) -> Section | None:
    """TTFB, TTFT, TTFO and the reasoning share of each decode cell; None for a run without
    reasoning."""
    rows = [_row(c) for _, c in reasoning_cells(cells).iterrows()]
    return chart_section("Reasoning", "reasoning", CHART, _COLUMNS, rows, _TEXT)


def first_output_times(cells: pd.DataFrame) -> Figure:
    """Median time to first byte, first token and first content token of each reasoning
    cell, side by side."""
    rows = reasoning_cells(cells)
    with plt.rc_context(STYLE):
        fig, ax = new_figure()
        if rows.empty or rows["ttft_ms"].isna().all():
            empty(ax, "no first token measured")
            return fig
        x = np.arange(len(rows))
        width = 0.8 / len(_TIMES)
        for k, (col, name) in enumerate(_TIMES):
            y = rows[col].to_numpy(float) if col in rows else np.full(len(rows), np.nan)
            ax.bar(x + (k - 1) * width, np.nan_to_num(y), width, label=name)
        names = [
            f"C={int(c['context'])} N={int(c['concurrency'])}" + (" hidden" if _hidden(c) else "")
            for _, c in rows.iterrows()
        ]
        ax.set_xticks(x, names)
        if len(names) > 6:  # many cells: slanted names that do not overlap
            ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.set_ylabel("ms (median)")
        ax.set_title("Time to first byte, first token and first content")
        ax.legend(fontsize=7.5)
    return fig
