"""The report's views of three traffic shapes (`speedmatrix.trafficplan`): the
prefill-interference cells (a table and the inflation-versus-streams chart), the trace
replays (a table and the lateness chart) and the sessions (a table and TTFT against the
cached prefix per turn). Each is shown only for a run that has such cells;
the numbers are the cells' stored figures, this module only arranges them."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from speedmatrix.report.chartstyle import STYLE, empty, new_figure
from speedmatrix.report.model import Section, chart_section

__all__ = [
    "INTERFERENCE_CHART",
    "LATENESS_CHART",
    "LATENESS_PERCENTILES",
    "SESSION_CHART",
    "inflation_by_streams",
    "interference_cells",
    "interference_section",
    "lateness_by_trace",
    "session_cells",
    "session_section",
    "trace_cells",
    "trace_section",
    "ttft_by_cached_prefix",
]

INTERFERENCE_CHART = "interference_inflation"
LATENESS_CHART = "trace_lateness"
#: the lateness percentiles shown (the run's --percentiles must hold them: the default does)
LATENESS_PERCENTILES = ("50", "90", "99")


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)) or pd.isna(value):
        return "—"
    return f"{float(value):.{digits}f}"


def _status(c: pd.Series) -> str:
    """The cell's status, with its reason when it has one."""
    status, reason = c.get("status"), c.get("reason")
    text = status if isinstance(status, str) else ""
    return f"{text}: {reason}" if isinstance(reason, str) and reason else text


def _phase_cells(cells: pd.DataFrame, phase: str) -> pd.DataFrame:
    """The run's cells of ``phase`` by context, load and repetition (maybe none)."""
    if "phase" not in cells:
        return cells.iloc[0:0]
    rows = cells[cells["phase"] == phase]
    return rows if rows.empty else rows.sort_values(["context", "concurrency", "repetition"])


def interference_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The run's interference cells by context and streams; empty when it has none."""
    return _phase_cells(cells, "interference")


_INTERFERENCE_COLUMNS = [
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
_INTERFERENCE_TEXT = (
    "N streams decode while one cold prompt of the row's tokens arrives every few "
    "seconds. The p99 time between tokens of the decoders' gaps that overlap a prefill "
    "(its send to its first token), against the gaps that overlap none, once every "
    "stream decodes; inflation is their ratio (1 = prefills cost the decoders nothing)."
)


def _interference_row(c: pd.Series) -> list[str]:
    return [
        str(int(c["context"])),
        str(int(c["concurrency"])),
        _num(c.get("interference_every_s"), 2),
        _num(c.get("interference_prefills"), 0),
        _num(c.get("tbt_clear_p99_ms")),
        _num(c.get("tbt_overlap_p99_ms")),
        _num(c.get("tbt_inflation"), 2),
        _num(c.get("gaps_over_100ms"), 0),
        _status(c),
    ]


def interference_section(cells: pd.DataFrame) -> Section | None:
    """Per (C, N): the decoders' p99 time between tokens clear of and during the prefills,
    its inflation and the gaps over 100 ms; None for a run without such cells."""
    rows = [_interference_row(c) for _, c in interference_cells(cells).iterrows()]
    return chart_section(
        "Prefill interference",
        "prefill-interference",
        INTERFERENCE_CHART,
        _INTERFERENCE_COLUMNS,
        rows,
        _INTERFERENCE_TEXT,
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


_TRACE_COLUMNS = [
    "Trace",
    "Speed-up",
    "Arrivals",
    "Completed",
    *(f"Late p{p} ms" for p in LATENESS_PERCENTILES),
    "TTFT ms",
    "Status",
]
_TRACE_TEXT = (
    "The trace's requests were sent at their arrival times divided by the speed-up, "
    "each with its own prompt and output length. Lateness is each send's delay after "
    "its scheduled time (sent - scheduled, over completed arrivals; with a client gate "
    "it includes the wait at the gate)."
)


def _trace_row(c: pd.Series) -> list[str]:
    return [
        str(c["trace"]).rsplit("/", 1)[-1],
        _num(c.get("speedup"), 2),
        _num(c.get("open_loop_arrivals"), 0),
        _num(c.get("open_loop_completed"), 0),
        *(_num(_lateness(c, p), 2) for p in LATENESS_PERCENTILES),
        _num(c.get("ttft_ms")),
        _status(c),
    ]


def trace_section(cells: pd.DataFrame) -> Section | None:
    """Per replay: the trace, its speed-up, arrivals and completions, and the lateness of
    the sends against the schedule at p50/p90/p99; None for a run without a replay."""
    rows = [_trace_row(c) for _, c in trace_cells(cells).iterrows()]
    return chart_section(
        "Trace replay", "trace-replay", LATENESS_CHART, _TRACE_COLUMNS, rows, _TRACE_TEXT
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


SESSION_CHART = "session_ttft_vs_cached_prefix"


def session_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The run's sessions cells by context and sessions at once; empty when it has none."""
    return _phase_cells(cells, "session")


def _turns(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple, np.ndarray)) else []


_SESSION_COLUMNS = [
    "First prompt",
    "Sessions",
    "Turns",
    "TTFT turn 1 ms",
    "TTFT last turn ms",
    "TBT ms",
    "Turns/s",
    "Output tok/s",
    "Session s",
    "Sent late p99 ms",
    "Answers",
    "Status",
]
_SESSION_TEXT = (
    "Each session's turn adds the answer the server gave (its ids from the stream, the "
    "server's tokenize endpoint or the local tokenizer; else a stand-in) and a new user "
    "message to its prompt; the server has seen the previous turn's prompt and answer "
    "(the cached prefix). Sessions run free: each sends its next turn at its own answer's "
    "end + the think time, never waiting for the others, so later turns reach the server "
    "as their sessions get there, not as a burst; how late the client sent them after they "
    'were due is "Sent late p99" (session_send_late_p99_ms; flag sessions_late past 50 ms).'
)


def _answers(c: pd.Series) -> str:
    """Answers by source (`session_answer_source`), e.g. "stream 6"; — for a run without.
    The cells frame flattens the dict to ``session_answer_source_<source>`` columns."""
    value = c.get("session_answer_source")
    if not isinstance(value, dict):
        prefix = "session_answer_source_"
        value = {
            k[len(prefix) :]: v
            for k, v in c.items()
            if str(k).startswith(prefix) and isinstance(v, (int, float)) and not math.isnan(v)
        }
    if not value:
        return "—"
    return ", ".join(f"{k} {int(v)}" for k, v in sorted(value.items()))


def _session_row(c: pd.Series) -> list[str]:
    ttft, cached = (
        _turns(c.get("session_ttft_ms_by_turn")),
        _turns(c.get("session_turn_cached_tokens")),
    )
    said = _turns(c.get("session_turn_delivered_cached_tokens"))
    server = f", server {said[-1]}" if said and said[-1] is not None else ""
    return [
        str(int(c["context"])),
        str(int(c["concurrency"])),
        _num(c.get("sessions"), 0),
        _num(ttft[0] if ttft else None),
        f"{_num(ttft[-1] if ttft else None)} ({cached[-1] if cached else '—'} cached{server})",
        _num(c.get("session_tbt_ms")),
        _num(c.get("session_turns_per_s"), 2),
        _num(c.get("session_output_tok_s")),
        _num(c.get("session_duration_s"), 2),
        _num(c.get("session_send_late_p99_ms"), 2),
        _answers(c),
        _status(c),
    ]


def session_section(cells: pd.DataFrame) -> Section | None:
    """Per (C, N): the turns, TTFT of the first and last turn against the cached prefix,
    time between tokens, turns/s, output tok/s, session duration and how late later turns
    were sent; None without such cells."""
    rows = [_session_row(c) for _, c in session_cells(cells).iterrows()]
    return chart_section(
        "Sessions", "sessions", SESSION_CHART, _SESSION_COLUMNS, rows, _SESSION_TEXT
    )


def ttft_by_cached_prefix(cells: pd.DataFrame) -> Figure:
    """Median TTFT of each turn against the prefix the server had cached for it, a line per
    sessions cell."""
    rows = session_cells(cells)
    with plt.rc_context(STYLE):
        fig, ax = new_figure()
        drawn = False
        for _, c in rows.iterrows():
            y = np.asarray(_turns(c.get("session_ttft_ms_by_turn")), dtype=float)
            x = np.asarray(_turns(c.get("session_turn_cached_tokens")), dtype=float)
            if len(x) != len(y) or not np.isfinite(y).any():
                continue
            ok = np.isfinite(y)
            label = f"C={int(c['context'])} N={int(c['concurrency'])}"
            ax.plot(x[ok], y[ok], marker="o", ms=3.5, label=label)
            drawn = True
        if not drawn:
            empty(ax, "no session measured")
            return fig
        ax.set_xlabel("prompt tokens cached (the previous turn's prompt and answer)")
        ax.set_ylabel("TTFT (ms, median of the turn)")
        ax.set_title("Sessions: time to first token by turn")
        ax.legend(fontsize=7.5, ncols=2)
    return fig
