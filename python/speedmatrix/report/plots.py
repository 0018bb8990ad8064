"""Charts of a run (matplotlib, Agg backend). Each function returns a Figure.

from speedmatrix.report import plots
fig = plots.decode_heatmap(run)
svg = plots.figure_to_svg(fig)        # inline SVG for HTML

The shared style, title line and SVG export are in `chartstyle`; the heatmap in `heatmap`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import by_rate
from speedmatrix.report.chartstyle import (
    BAND_ALPHA,
    STYLE,
    cell_name,
    context_ticks,
    empty,
    figure_to_svg,
    new_figure,
    run_line,
    set_title,
)
from speedmatrix.report.goodput import slo_capacities
from speedmatrix.report.heatmap import decode_heatmap, mark_predicted_points, predicted_handles
from speedmatrix.report.predicted import predicted_keys
from speedmatrix.report.prefixcache import CHART as CACHE_CHART
from speedmatrix.report.prefixcache import cache_cells, ttft_by_cached_fraction
from speedmatrix.report.traffic import (
    INTERFERENCE_CHART,
    LATENESS_CHART,
    SESSION_CHART,
    inflation_by_streams,
    interference_cells,
    lateness_by_trace,
    session_cells,
    trace_cells,
    ttft_by_cached_prefix,
)

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

#: the charts' shared names, used from here by the report, compare and notebooks
__all__ = [
    "all_figures",
    "capacity_vs_load",
    "decode_heatmap",
    "figure_to_svg",
    "per_request_vs_concurrency",
    "prefill_vs_context",
    "representative_cell",
    "run_line",
    "tbt_distribution",
    "throughput_over_time",
    "total_vs_concurrency",
    "ttft_vs_context",
]


def _decode_lines(
    run: Run, figure: str, ylabel: str, title: str, logy: bool, bands: bool = True
) -> Figure:
    with plt.rc_context(STYLE):
        fig, ax = new_figure()
        vals = run.table(figure)
        cells = run.cells
        dec = cells[cells["phase"] == "decode"] if "phase" in cells else cells
        lo_col, hi_col = f"{figure}_lo", f"{figure}_hi"
        plotted = queued = False
        md = run.matrix_definition
        guessed = predicted_keys(run)
        colors = matplotlib.colormaps["viridis"](np.linspace(0, 0.9, max(1, len(md["contexts"]))))
        for k, (label, row) in enumerate(vals.iterrows()):
            x = np.array([float(c) for c in vals.columns])
            y = row.to_numpy(float)
            ok = np.isfinite(y)
            if not ok.any():
                continue
            plotted = True
            ax.plot(x[ok], y[ok], marker="o", ms=4, label=str(label), color=colors[k])
            ctx = md["contexts"][k]
            mark_predicted_points(ax, guessed, int(ctx), vals.columns, (x, y, ok), colors[k])
            sub = dec[(dec["context"] == ctx) & dec[figure].notna()] if figure in dec else dec[:0]
            if bands and lo_col in sub and sub[lo_col].notna().any():
                sub = sub.sort_values("concurrency")
                lo = sub[lo_col].to_numpy(float)
                hi = sub[hi_col].to_numpy(float)
                bad = ~(np.isfinite(lo) & np.isfinite(hi)) | (lo <= 0)  # too few bins: no band
                lo, hi = np.where(bad, np.nan, lo), np.where(bad, np.nan, hi)
                ax.fill_between(
                    sub["concurrency"].to_numpy(float),
                    lo,
                    hi,
                    color=colors[k],
                    alpha=BAND_ALPHA,
                    lw=0,
                )
            q = dec[(dec["context"] == ctx) & (dec["status"] == "queued")] if len(dec) else dec
            if len(q) and figure in q:
                queued = True
                ax.scatter(
                    q["concurrency"].astype(float),
                    q[figure],
                    marker="s",
                    s=40,
                    facecolor="none",
                    edgecolor="#e67e22",
                    zorder=3,
                )
        if not plotted:
            empty(ax, "no measured decode cells")
            return fig
        ax.set_xscale("log", base=2)
        ax.set_xticks([float(c) for c in vals.columns], [str(c) for c in vals.columns])
        ax.minorticks_off()
        if logy:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)  # a share of single-stream speed is read off this axis
        ax.set_xlabel("simultaneous requests")
        ax.set_ylabel(ylabel)
        set_title(ax, run, title)
        handles, _ = ax.get_legend_handles_labels()
        handles += predicted_handles(guessed)
        if queued:  # the square's meaning, only where a cell is queued
            handles.append(
                Line2D(
                    [],
                    [],
                    marker="s",
                    ls="",
                    markerfacecolor="none",
                    markeredgecolor="#e67e22",
                    label="requests queued",
                )
            )
        ax.legend(handles=handles, title="context", fontsize=8, ncols=2 if len(vals) > 6 else 1)
    return fig


def total_vs_concurrency(run: Run, bands: bool = True) -> Figure:
    """Total tok/s versus simultaneous requests, one line per context (light 95% CI bands;
    ``bands=False`` leaves them out)."""
    return _decode_lines(
        run, "total_tok_s", "total tok/s", "Total throughput", logy=True, bands=bands
    )


def per_request_vs_concurrency(run: Run, bands: bool = True) -> Figure:
    """Per-request tok/s versus simultaneous requests, one line per context; the y axis starts
    at zero, since the drop from single-stream speed is read as a share."""
    return _decode_lines(
        run, "per_request_tok_s", "per request tok/s", "Per-request speed", logy=False, bands=bands
    )


def ttft_vs_context(run: Run) -> Figure:
    """Warm TTFT of decode cells versus context (one line per concurrency) and cold prefill TTFT."""
    with plt.rc_context(STYLE):
        fig, ax = new_figure()
        vals = run.table("ttft_ms")
        md = run.matrix_definition
        x = np.array(md["contexts"], float)
        plotted = False
        colors = matplotlib.colormaps["plasma"](np.linspace(0, 0.85, max(1, vals.shape[1])))
        for k, n in enumerate(vals.columns):
            y = vals[n].to_numpy(float)
            ok = np.isfinite(y)
            if ok.any():
                plotted = True
                ax.plot(x[ok], y[ok], marker="o", ms=3.5, color=colors[k], label=f"{n} at once")
        pre = run.prefill()
        pre = pre[pre["ttft_ms"].notna()]
        if len(pre):
            plotted = True
            ax.plot(
                pre["context"],
                pre["ttft_ms"],
                color="black",
                ls="--",
                marker="D",
                ms=4,
                label="prefill (cold)",
            )
        if not plotted:
            empty(ax, "no TTFT measured")
            return fig
        allx = sorted(set(md["contexts"]) | set(pre["context"].tolist()))
        ax.set_xscale("log", base=2)
        context_ticks(ax, allx)
        ax.set_yscale("log")
        ax.set_xlabel("context length")
        ax.set_ylabel("TTFT (ms, median)")
        set_title(ax, run, "Time to first token")
        ax.legend(fontsize=7.5, ncols=2)
    return fig


def prefill_vs_context(run: Run) -> Figure:
    """Prefill prompt tok/s versus context, with the spread of repetitions when there are any."""
    with plt.rc_context(STYLE):
        fig, ax = new_figure(6.5, 3.6)
        pre = run.prefill()
        pre = pre[pre["prompt_tok_s"].notna()]
        if pre.empty:
            empty(ax, "no prefill cells")
            return fig
        x = pre["context"].to_numpy(float)
        y = pre["prompt_tok_s"].to_numpy(float)
        ax.plot(x, y, marker="o", color="#2c7fb8")
        lo, hi = pre["prompt_tok_s_lo"].to_numpy(float), pre["prompt_tok_s_hi"].to_numpy(float)
        ok = np.isfinite(lo) & np.isfinite(hi)
        if ok.any():
            ax.errorbar(
                x[ok],
                y[ok],
                yerr=[y[ok] - lo[ok], hi[ok] - y[ok]],
                fmt="none",
                ecolor="#2c7fb8",
                capsize=3,
            )
        # Contexts close on the log axis (123K and 128K) would print their labels on top
        # of each other: the second of a close pair goes below its point.
        prev_above = None
        for xi, yi in sorted(zip(x, y)):
            close = prev_above is not None and np.log2(xi) - np.log2(prev_above) < 0.3
            ax.annotate(
                fmt.tok_s_short(yi),
                (xi, yi),
                textcoords="offset points",
                xytext=(0, -12 if close else 6),
                ha="center",
                fontsize=7.5,
            )
            prev_above = None if close else xi
        ax.set_xscale("log", base=2)
        context_ticks(ax, x)
        ax.set_ylim(0, float(np.nanmax(y)) * 1.18)
        ax.set_xlabel("context length")
        ax.set_ylabel("prompt tok/s")
        set_title(ax, run, "Prefill speed")
    return fig


def tbt_distribution(run: Run, cell_id: str, bins: int = 60) -> Figure:
    """Histogram of the time between tokens inside a cell's window, median/p90/p99 marked."""
    with plt.rc_context(STYLE):
        fig, ax = new_figure(6.5, 3.4)
        try:
            samples = run.tbt_samples(cell_id)
        except KeyError:
            samples = np.zeros(0)
        samples = samples[np.isfinite(samples)]
        if samples.size == 0:
            empty(ax, f"no token records for {cell_id}")
            return fig
        hi = float(np.percentile(samples, 99.5))
        ax.hist(np.clip(samples, 0, hi), bins=bins, color="#41ab5d", alpha=0.85)
        for q, ls in ((50, "-"), (90, "--"), (99, ":")):
            v = float(np.percentile(samples, q))
            ax.axvline(v, color="black", ls=ls, lw=1, label=f"p{q} {fmt.ms1(v)}")
        ax.set_xlabel("time between tokens (ms)")
        ax.set_ylabel("tokens")
        set_title(ax, run, f"Time between tokens: {cell_name(run, cell_id)}")
        ax.legend(fontsize=8)
    return fig


def throughput_over_time(run: Run, cell_id: str, bin_s: float = 1.0) -> Figure:
    """Output tok/s per second across a cell's window (shows drift and ramp-up)."""
    with plt.rc_context(STYLE):
        fig, ax = new_figure(6.5, 3.0)
        b = run.bins(cell_id, bin_s)
        if b.size == 0:
            empty(ax, f"no token records for {cell_id}")
            return fig
        # the bins' edges: a remainder shorter than a bin widens the last one (Records.bins),
        # so the window ends at its measured length, not at the last bin's start
        edges = np.arange(b.size + 1) * bin_s
        measured = run.cell(cell_id).get("measured_s")
        measured_s = float("nan") if measured is None else float(measured)
        if measured_s > edges[-2]:  # False for NaN: an unknown length keeps whole bins
            edges[-1] = measured_s
        ax.stairs(b, edges, color="#6a51a3", lw=1.5)
        ax.set_xlim(0, edges[-1])
        ax.set_xlabel("seconds into the window")
        ax.set_ylabel("tok/s")
        set_title(ax, run, f"Throughput across the window: {cell_name(run, cell_id)}")
    return fig


def capacity_vs_load(
    run: Run,
    caps: dict[int, dict],
    slo_text: str,
    attainment: float,
) -> Figure:
    """SLO attainment versus load per context (``caps``: `Run.capacity`'s answer), the target
    attainment as a dashed line and each context's interpolated estimate marked where its
    line crosses it (a vertical tick for "at least"/"below" answers has no estimate)."""
    with plt.rc_context(STYLE):
        fig, ax = new_figure(7.0, 4.0)
        pts = {ctx: cap.get("points") or [] for ctx, cap in caps.items()}
        if not any(pts.values()):
            empty(ax, "no decode cell judged against the SLO")
            return fig
        rate = any(cap.get("by") == "rate" for cap in caps.values())
        colors = matplotlib.colormaps["viridis"](np.linspace(0, 0.9, max(1, len(caps))))
        xs_all: list[float] = []
        estimated = False
        for k, (ctx, cap) in enumerate(caps.items()):
            p = np.array(pts[ctx], float).reshape(-1, 2)
            if not len(p):
                continue
            xs_all += p[:, 0].tolist()
            label = str(cap.get("label") or fmt.context_label(ctx))
            # straight in load, as the estimate interpolates, whatever the axis scale: the
            # estimate's mark then sits on the line
            dense = np.concatenate(
                [np.linspace(a, b, 24) for a, b in zip(p[:-1, 0], p[1:, 0])] or [p[:, 0]]
            )
            ax.plot(dense, np.interp(dense, p[:, 0], p[:, 1]) * 100, color=colors[k], label=label)
            ax.plot(p[:, 0], p[:, 1] * 100, marker="o", ms=4, ls="", color=colors[k])
            est = cap.get("estimate")
            if est is not None:
                estimated = True
                ax.plot(
                    [est], [attainment * 100], marker="X", ms=9, color=colors[k],
                    markeredgecolor="black", markeredgewidth=0.6, ls="", zorder=4,
                )  # fmt: skip
                ax.annotate(
                    f"{est:.3g}",
                    (est, attainment * 100),
                    textcoords="offset points",
                    xytext=(4, -12),
                    fontsize=7.5,
                    color=colors[k],
                )
        ax.axhline(attainment * 100, color="#c0392b", ls="--", lw=1)
        xs = sorted(set(xs_all))
        if xs and min(xs) > 0 and max(xs) / min(xs) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.set_ylim(-3, 103)
        ax.set_xlabel("request rate (req/s)" if rate else "simultaneous requests")
        ax.set_ylabel("requests meeting the SLO (%)")
        set_title(ax, run, f"SLO attainment versus load: {slo_text}")
        handles, _ = ax.get_legend_handles_labels()
        handles.append(
            Line2D([], [], color="#c0392b", ls="--", lw=1, label=f"target {attainment:.0%}")
        )
        if estimated:
            handles.append(
                Line2D(
                    [], [], marker="X", ls="", color="0.4", markeredgecolor="black",
                    label="capacity estimate",
                )
            )  # fmt: skip
        ax.legend(handles=handles, title="context", fontsize=7.5, loc="best")
    return fig


def representative_cell(run: Run) -> str | None:
    """A decode cell worth showing in detail: the measured one with the highest throughput."""
    c = run.cells
    if "phase" not in c:
        return None
    d = c[(c["phase"] == "decode") & c["total_tok_s"].notna()] if "total_tok_s" in c else c[:0]
    d = d[d["records"].notna()] if "records" in d else d[:0]
    if d.empty:
        return None
    return str(d.sort_values("total_tok_s", ascending=False)["id"].iloc[0])


def all_figures(run: Run, slo: Any = None) -> dict[str, Figure]:
    """The report's charts, by name; ``slo`` (`speedmatrix.report.goodput.SloSettings`) adds
    the attainment-versus-load chart. A request-rate run has no concurrency axis: its
    concurrency charts are left out (its grid is in the report's tables)."""
    figs: dict[str, Figure] = {}
    if not by_rate(run):
        figs["decode_heatmap"] = decode_heatmap(run)
        figs["total_vs_concurrency"] = total_vs_concurrency(run)
        figs["per_request_vs_concurrency"] = per_request_vs_concurrency(run)
        figs["ttft_vs_context"] = ttft_vs_context(run)
    if run.prefill()["prompt_tok_s"].notna().any():  # else the section says none was measured
        figs["prefill_vs_context"] = prefill_vs_context(run)
    if not cache_cells(run.all_cells).empty:
        figs[CACHE_CHART] = ttft_by_cached_fraction(run.all_cells)
    if not interference_cells(run.all_cells).empty:
        figs[INTERFERENCE_CHART] = inflation_by_streams(run.all_cells)
    if not trace_cells(run.all_cells).empty:
        figs[LATENESS_CHART] = lateness_by_trace(run.all_cells)
    if not session_cells(run.all_cells).empty:
        figs[SESSION_CHART] = ttft_by_cached_prefix(run.all_cells)
    if slo is not None:
        caps = slo_capacities(run, slo)
        if caps:
            figs["capacity_vs_load"] = capacity_vs_load(run, caps, slo.text, slo.attainment)
    cid = representative_cell(run)
    if cid:
        figs["tbt_distribution"] = tbt_distribution(run, cid)
        figs["throughput_over_time"] = throughput_over_time(run, cid)
    return figs
