"""The report's views of two traffic shapes (`speedmatrix.trafficplan`): the
prefill-interference cells (a table and the inflation-versus-streams chart) and the trace
replays (a table and the lateness chart). Each is shown only for a run that has such cells;
the numbers are the cells' stored figures, this module only arranges them."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from speedmatrix.report.chartstyle import STYLE, empty, new_figure
from speedmatrix.report.model import Section, Table

__all__ = [
    "INTERFERENCE_CHART",
    "LATENESS_CHART",
    "LATENESS_PERCENTILES",
    "inflation_by_streams",
    "interference_cells",
    "interference_section",
    "lateness_by_trace",
    "trace_cells",
    "trace_section",
]

INTERFERENCE_CHART = "interference_inflation"
LATENESS_CHART = "trace_lateness"
#: the lateness percentiles shown (the run's --percentiles must hold them: the default does)
LATENESS_PERCENTILES = ("50", "90", "99")


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)) or pd.isna(value):
        return "—"
    return f"{float(value):.{digits}f}"


def interference_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The run's interference cells by context and streams; empty when it has none."""
    if "phase" not in cells:
        return cells.iloc[0:0]
    rows = cells[cells["phase"] == "interference"]
    return rows.sort_values(["context", "concurrency", "repetition"])


def interference_section(cells: pd.DataFrame) -> Section | None:
    """Per (C, N): the decoders' p99 time between tokens clear of and during the prefills,
    its inflation and the gaps over 100 ms; None for a run without such cells."""
    rows = interference_cells(cells)
    if rows.empty:
        return None
    table_rows = []
    for _, c in rows.iterrows():
        table_rows.append(
            [
                str(int(c["context"])),
                str(int(c["concurrency"])),
                _num(c.get("interference_every_s"), 2),
                _num(c.get("interference_prefills"), 0),
                _num(c.get("tbt_clear_p99_ms")),
                _num(c.get("tbt_overlap_p99_ms")),
                _num(c.get("tbt_inflation"), 2),
                _num(c.get("gaps_over_100ms"), 0),
                str(c.get("reason") or c.get("status") or ""),
            ]
        )
    columns = [
        "Prefill tokens",
        "Streams",
        "Every s",
        "Prefills",
        "TBT p99 clear ms",
        "TBT p99 during ms",
        "Inflation",
        "Gaps > 100 ms",
        "Status",
    ]
    text = (
        "N streams decode while one cold prompt of the row's tokens arrives every few "
        "seconds. The p99 time between tokens of the decoders' gaps that overlap a prefill "
        "(its send to its first token), against the gaps that overlap none, once every "
        "stream decodes; inflation is their ratio (1 = prefills cost the decoders nothing)."
    )
    return Section(
        "Prefill interference",
        table=Table(columns, table_rows),
        text=[text],
        anchor="prefill-interference",
        charts=[INTERFERENCE_CHART],
    )


def inflation_by_streams(cells: pd.DataFrame) -> Figure:
    """The inflation of the decoders' p99 time between tokens against N, a line per C."""
    rows = interference_cells(cells)
    with plt.rc_context(STYLE):
        fig, ax = new_figure()
        y_all = pd.to_numeric(rows.get("tbt_inflation"), errors="coerce")
        if rows.empty or y_all is None or y_all.isna().all():
            empty(ax, "no interference measured")
            return fig
        for ctx, group in rows.groupby("context"):
            y = pd.to_numeric(group["tbt_inflation"], errors="coerce").to_numpy(float)
            x = group["concurrency"].to_numpy(float)
            ok = np.isfinite(y)
            ax.plot(x[ok], y[ok], marker="o", ms=3.5, label=f"prefill {int(ctx)} tokens")
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xlabel("decoding streams")
        ax.set_ylabel("TBT p99 during / clear of prefills")
        ax.set_title("Prefill interference")
        ax.legend(fontsize=7.5)
    return fig


def trace_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The run's trace replays; empty when it has none."""
    if "trace" not in cells:
        return cells.iloc[0:0]
    return cells[cells["trace"].notna() & (cells["trace"] != "")]


def _lateness(c: pd.Series, p: str) -> Any:
    return c.get(f"queue_p{p}_ms")


def trace_section(cells: pd.DataFrame) -> Section | None:
    """Per replay: the trace, its speed-up, arrivals and completions, and the lateness of
    the sends against the schedule at p50/p90/p99; None for a run without a replay."""
    rows = trace_cells(cells)
    if rows.empty:
        return None
    table_rows = []
    for _, c in rows.iterrows():
        table_rows.append(
            [
                str(c["trace"]).rsplit("/", 1)[-1],
                _num(c.get("speedup"), 2),
                _num(c.get("open_loop_arrivals"), 0),
                _num(c.get("open_loop_completed"), 0),
                *(_num(_lateness(c, p), 2) for p in LATENESS_PERCENTILES),
                _num(c.get("ttft_ms")),
                str(c.get("status") or ""),
            ]
        )
    columns = ["Trace", "Speed-up", "Arrivals", "Completed"]
    columns += [f"Late p{p} ms" for p in LATENESS_PERCENTILES] + ["TTFT ms", "Status"]
    text = (
        "The trace's requests were sent at their arrival times divided by the speed-up, "
        "each with its own prompt and output length. Lateness is each send's delay after "
        "its scheduled time (sent - scheduled, over completed arrivals; with a client gate "
        "it includes the wait at the gate)."
    )
    return Section(
        "Trace replay",
        table=Table(columns, table_rows),
        text=[text],
        anchor="trace-replay",
        charts=[LATENESS_CHART],
    )


def lateness_by_trace(cells: pd.DataFrame) -> Figure:
    """The sends' lateness at each shown percentile, a group of bars per replay."""
    rows = trace_cells(cells)
    with plt.rc_context(STYLE):
        fig, ax = new_figure()
        if rows.empty:
            empty(ax, "no trace replayed")
            return fig
        width = 0.8 / len(LATENESS_PERCENTILES)
        x = np.arange(len(rows))
        for k, p in enumerate(LATENESS_PERCENTILES):
            col = f"queue_p{p}_ms"
            y = pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(np.nan)
            ax.bar(x + k * width, y.to_numpy(float), width, label=f"p{p}")
        ax.set_xticks(x + 0.4 - width / 2, [str(i) for i in rows["id"]])
        ax.set_ylabel("send lateness (ms)")
        ax.set_title("Trace replay: lateness against the schedule")
        ax.legend(fontsize=7.5)
    return fig
