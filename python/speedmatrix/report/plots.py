"""Charts of a run (matplotlib, Agg backend). Each function returns a Figure.

from speedmatrix.report import plots
fig = plots.decode_heatmap(run)
svg = plots.figure_to_svg(fig)        # inline SVG for HTML

Over 500 lines: one function per chart of the report, sharing the style, the title line
that names the run, and the SVG export; split by chart they would only import each other.
"""

from __future__ import annotations

import io
import os
import re
import sys
from typing import TYPE_CHECKING, Any

import matplotlib

# Charts are drawn on plain Figure objects, so they never need a GUI. Outside Jupyter (where
# the inline backend shows them) and unless the user chose a backend, use Agg: headless and safe.
if "ipykernel" not in sys.modules and not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Polygon, Rectangle

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import by_rate, cell_flags, decode_cells
from speedmatrix.report.goodput import slo_capacities
from speedmatrix.report.metadata import engine_name, hardware_name, model_name

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

FLAG_COLOR = "#8e44ad"
#: CI bands are context, not the message: light enough that the lines stay readable
BAND_ALPHA = 0.07

_STYLE: Any = {  # rc_context is typed with literal keys
    "svg.fonttype": "none",  # text stays text: smaller SVG, no duplicate glyph ids
    "svg.hashsalt": "speedmatrix",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def _new(w: float = 7.0, h: float = 4.0, layout: Any = None) -> tuple[Figure, plt.Axes]:
    """A figure with one axes; fixed margins (fast) unless a layout engine is asked for."""
    with plt.rc_context(_STYLE):
        fig = Figure(figsize=(w, h), layout=layout)
        if layout is None:
            # room above for two title lines: the chart's name and the run it belongs to
            fig.subplots_adjust(left=0.8 / w, right=1 - 0.25 / w, bottom=0.55 / h, top=1 - 0.6 / h)
        ax = fig.add_subplot()
    return fig, ax


def run_line(run: Run) -> str:
    """Model · hardware · engine version · window: the second line of every chart's title,
    so a chart pasted on its own still says what was measured."""
    meta = run.meta
    eng = meta.get("engine") or {}
    engine = engine_name(meta) or "unknown engine"
    if not fmt.missing(eng.get("version")):
        # the local build label (+g05c584c44) is in the report; the chart keeps the release
        engine += f" {str(eng['version']).split('+')[0]}"
    parts = [model_name(meta), hardware_name(meta), engine]
    dur = (meta.get("run") or {}).get("duration_s")
    if fmt.missing(dur):
        dur = run.matrix_definition.get("duration_s")
    if not fmt.missing(dur):
        parts.append(f"{fmt.plain_seconds(dur)} window")
    return " · ".join(str(p) for p in parts)


def plain(s: str) -> str:
    """``s`` drawn as it reads: a "$" in a model id would start mathtext (and an unparsable
    formula stops the whole report), a line break would forge another title line."""
    return " ".join(str(s).split()).replace("$", r"\$")


#: the title's size, its gap above the axes and each line's height (points)
TITLE_PT = 8.0
TITLE_PAD_PT = 6.0
TITLE_LINE_PT = TITLE_PT * 1.3
#: the longest part (model, hardware, engine) of a chart's run line, in characters
PART_CHARS = 80


def _text_width_px(s: str, dpi: float, size: float = TITLE_PT) -> float:
    w, _h, _d = RendererAgg(1, 1, dpi).get_text_width_height_descent(
        s, FontProperties(size=size), ismath=False
    )
    return float(w)


def wrap_to_width(parts: list[str], width_px: float, dpi: float, sep: str = " · ") -> list[str]:
    """``parts`` joined by ``sep`` into as few lines as fit ``width_px`` (at ``dpi``), a part
    never split unless it alone is too wide (then at spaces, and a word too wide is cut)."""

    def fits(s: str) -> bool:
        return _text_width_px(s, dpi) <= width_px

    lines: list[str] = []
    for part in parts:
        if lines and fits(lines[-1] + sep + part):
            lines[-1] += sep + part
            continue
        line = ""
        for word in part.split(" "):
            cand = f"{line} {word}" if line else word
            if fits(cand):
                line = cand
                continue
            if line:
                lines.append(line)
            while len(word) > 1 and not fits(word):  # a word wider than the line: cut it
                k = len(word) - 1
                while k > 1 and not fits(word[:k]):
                    k -= 1
                lines.append(word[:k])
                word = word[k:]
            line = word
        if line:
            lines.append(line)
    return lines


def _title(ax, run: Run, title: str) -> None:
    """The chart's name and the run line (model · hardware · engine version · window) above
    the axes, wrapped to the width from the axes' left edge to the figure's right edge (a
    subtitle cut at the edge loses the version and window it exists to carry), with the room
    above the axes grown to hold every line."""
    fig = ax.get_figure()
    dpi = float(fig.dpi)
    w_in, h_in = fig.get_size_inches()
    left_in = ax.get_position().x0 * w_in if fig.get_layout_engine() is None else 0.8
    width_px = (w_in - left_in - 0.1) * dpi
    parts = [_bounded(plain(p)) for p in run_line(run).split(" · ")]
    lines = wrap_to_width([_bounded(plain(title), 2 * PART_CHARS)], width_px, dpi)
    lines += wrap_to_width(parts, width_px, dpi)
    ax.set_title("\n".join(lines), fontsize=TITLE_PT, loc="left", pad=TITLE_PAD_PT)
    if fig.get_layout_engine() is None:  # fixed margins: make room for the lines above
        need_in = (TITLE_PAD_PT + len(lines) * TITLE_LINE_PT + 6) / 72
        top = 1 - max(need_in, 0.6) / h_in
        if top < ax.get_position().y1:
            fig.subplots_adjust(top=top)


def _bounded(s: str, n: int = PART_CHARS) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def cell_name(run: Run, cell_id: str) -> str:
    """``8K context × 64 requests`` for a cell id such as ``decode-c8192-n64-r0``."""
    try:
        c = run.cell(cell_id)
    except KeyError:
        return cell_id
    n = c.get("concurrency")
    name = f"{fmt.context_label(c.get('context'))} context × {fmt.plural(int(n or 0), 'request')}"
    rep = int(c.get("repetition") or 0)
    if rep > 0:
        name += f" (repetition {rep + 1})"
    return name


def _context_ticks(ax, contexts) -> None:
    """Context ticks on a log2 axis; labels closer than ~10% to the previous one are left blank."""
    xs = sorted({float(c) for c in contexts})
    labels: list[str] = []
    last = None  # index of the last labelled tick
    for k, x in enumerate(xs):
        if last is not None and np.log2(x / xs[last]) < 0.15:
            # too close to print apart (123K and 128K): the first tick names both
            labels[last] += "/" + fmt.context_label(x)
            labels.append("")
            continue
        labels.append(fmt.context_label(x))
        last = k
    ax.set_xticks(xs, labels)
    ax.minorticks_off()


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def decode_heatmap(run: Run, figure: str = "total_tok_s") -> Figure:
    """Context × concurrency heatmap of a decode figure, annotated with the seed's numbers.

    Over-capacity cells are grey and hatched, error cells hatched red, queued
    cells get a dashed outline, cells an interrupted run never reached are blank.
    """
    with plt.rc_context(_STYLE):
        vals = run.table(figure)
        st = run.statuses()
        nr, nc = vals.shape
        fig, ax = _new(max(5.0, 0.9 * nc + 2), max(2.8, 0.55 * nr + 1.6), layout="constrained")
        ax.grid(False)
        if nr == 0 or nc == 0:
            _empty(ax, "no decode cells")
            return fig
        data = vals.to_numpy(float)
        masked = np.ma.masked_invalid(data)
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
        finite = data[np.isfinite(data)]
        vmin = float(finite.min()) if finite.size else 0.0
        vmax = float(finite.max()) if finite.size else 1.0
        norm = (
            matplotlib.colors.LogNorm(max(vmin, 1e-9), max(vmax, vmin * 1.0001 + 1e-9))
            if finite.size and vmin > 0 and vmax / max(vmin, 1e-9) > 20
            else matplotlib.colors.Normalize(vmin, vmax if vmax > vmin else vmin + 1)
        )
        im = ax.imshow(masked, cmap=cmap, norm=norm, aspect="auto")
        text_fn = (
            fmt.ms
            if figure.startswith("ttft")
            else (fmt.ms1 if figure.startswith("tbt") else fmt.tok_s)
        )
        for i in range(nr):
            for j in range(nc):
                s = st.iat[i, j]
                v = data[i, j]
                if s == "over_capacity":
                    ax.add_patch(
                        Rectangle(
                            (j - 0.5, i - 0.5),
                            1,
                            1,
                            facecolor="0.85",
                            hatch="//",
                            edgecolor="0.6",
                            lw=0,
                        )
                    )
                    ax.text(
                        j, i, "Over\ncapacity", ha="center", va="center", fontsize=7, color="0.3"
                    )
                    continue
                if s is None:
                    ax.text(j, i, "not run", ha="center", va="center", fontsize=7, color="0.5")
                    continue
                if s == "error":
                    ax.add_patch(
                        Rectangle(
                            (j - 0.5, i - 0.5),
                            1,
                            1,
                            facecolor="none",
                            hatch="xx",
                            edgecolor="#c0392b",
                            lw=0,
                        )
                    )
                if s == "queued":
                    ax.add_patch(
                        Rectangle(
                            (j - 0.45, i - 0.45),
                            0.9,
                            0.9,
                            facecolor="none",
                            edgecolor="#e67e22",
                            lw=1.5,
                            ls="--",
                        )
                    )
                label = text_fn(v).replace(" ms", "") if np.isfinite(v) else "Error"
                if s == "queued":
                    label += "\nqueued"
                if np.isfinite(v):
                    rgba = cmap(norm(v))
                    lum = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]
                    color = "black" if lum > 0.5 else "white"
                else:
                    color = "#c0392b"
                ax.text(j, i, label, ha="center", va="center", fontsize=7.5, color=color)
        ax.set_xticks(range(nc), [str(c) for c in vals.columns])
        ax.set_yticks(range(nr), list(vals.index))
        ax.set_xlabel("simultaneous requests")
        ax.set_ylabel("context length")
        names = {
            "total_tok_s": "total tok/s",
            "per_request_tok_s": "per request tok/s",
            "ttft_ms": "TTFT (ms)",
            "tbt_ms": "time between tokens (ms)",
        }
        _title(ax, run, f"Sustained decode: {names.get(figure, figure)}")
        groups = _decode_flags(run)
        md = run.matrix_definition
        flagged = False
        for i, ctx in enumerate(md["contexts"]):
            for j, n in enumerate(md["concurrency"]):
                if st.iat[i, j] in ("valid", "queued") and groups.get((int(ctx), int(n))):
                    flagged = True
                    # a corner triangle: a flagged figure must not read as a clean one
                    ax.add_patch(
                        Polygon(
                            [(j + 0.5, i - 0.5), (j + 0.18, i - 0.5), (j + 0.5, i - 0.18)],
                            closed=True,
                            facecolor=FLAG_COLOR,
                            edgecolor="white",
                            lw=0.5,
                        )
                    )
        if flagged:
            ax.legend(
                handles=[
                    Line2D(
                        [],
                        [],
                        marker=">",
                        ls="",
                        color=FLAG_COLOR,
                        label="flagged: see the report's Flags",
                    )
                ],
                loc="upper left",
                bbox_to_anchor=(0, -0.12),
                fontsize=7.5,
                frameon=False,
            )
        fig.colorbar(im, ax=ax, shrink=0.8, label=names.get(figure, figure))
    return fig


def _decode_flags(run: Run) -> dict[tuple[int, int], list[str]]:
    return {k: cell_flags(v) for k, v in decode_cells(run).items()}


def _decode_lines(
    run: Run, figure: str, ylabel: str, title: str, logy: bool, bands: bool = True
) -> Figure:
    with plt.rc_context(_STYLE):
        fig, ax = _new()
        vals = run.table(figure)
        cells = run.cells
        dec = cells[cells["phase"] == "decode"] if "phase" in cells else cells
        lo_col, hi_col = f"{figure}_lo", f"{figure}_hi"
        plotted = queued = False
        md = run.matrix_definition
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
            _empty(ax, "no measured decode cells")
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
        _title(ax, run, title)
        handles, _ = ax.get_legend_handles_labels()
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
    with plt.rc_context(_STYLE):
        fig, ax = _new()
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
            _empty(ax, "no TTFT measured")
            return fig
        allx = sorted(set(md["contexts"]) | set(pre["context"].tolist()))
        ax.set_xscale("log", base=2)
        _context_ticks(ax, allx)
        ax.set_yscale("log")
        ax.set_xlabel("context length")
        ax.set_ylabel("TTFT (ms, median)")
        _title(ax, run, "Time to first token")
        ax.legend(fontsize=7.5, ncols=2)
    return fig


def prefill_vs_context(run: Run) -> Figure:
    """Prefill prompt tok/s versus context, with the spread of repetitions when there are any."""
    with plt.rc_context(_STYLE):
        fig, ax = _new(6.5, 3.6)
        pre = run.prefill()
        pre = pre[pre["prompt_tok_s"].notna()]
        if pre.empty:
            _empty(ax, "no prefill cells")
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
        _context_ticks(ax, x)
        ax.set_ylim(0, float(np.nanmax(y)) * 1.18)
        ax.set_xlabel("context length")
        ax.set_ylabel("prompt tok/s")
        _title(ax, run, "Prefill speed")
    return fig


def tbt_distribution(run: Run, cell_id: str, bins: int = 60) -> Figure:
    """Histogram of the time between tokens inside a cell's window, median/p90/p99 marked."""
    with plt.rc_context(_STYLE):
        fig, ax = _new(6.5, 3.4)
        try:
            samples = run.tbt_samples(cell_id)
        except KeyError:
            samples = np.zeros(0)
        samples = samples[np.isfinite(samples)]
        if samples.size == 0:
            _empty(ax, f"no token records for {cell_id}")
            return fig
        hi = float(np.percentile(samples, 99.5))
        ax.hist(np.clip(samples, 0, hi), bins=bins, color="#41ab5d", alpha=0.85)
        for q, ls in ((50, "-"), (90, "--"), (99, ":")):
            v = float(np.percentile(samples, q))
            ax.axvline(v, color="black", ls=ls, lw=1, label=f"p{q} {fmt.ms1(v)}")
        ax.set_xlabel("time between tokens (ms)")
        ax.set_ylabel("tokens")
        _title(ax, run, f"Time between tokens: {cell_name(run, cell_id)}")
        ax.legend(fontsize=8)
    return fig


def throughput_over_time(run: Run, cell_id: str, bin_s: float = 1.0) -> Figure:
    """Output tok/s per second across a cell's window (shows drift and ramp-up)."""
    with plt.rc_context(_STYLE):
        fig, ax = _new(6.5, 3.0)
        b = run.bins(cell_id, bin_s)
        if b.size == 0:
            _empty(ax, f"no token records for {cell_id}")
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
        _title(ax, run, f"Throughput across the window: {cell_name(run, cell_id)}")
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
    with plt.rc_context(_STYLE):
        fig, ax = _new(7.0, 4.0)
        pts = {ctx: cap.get("points") or [] for ctx, cap in caps.items()}
        if not any(pts.values()):
            _empty(ax, "no decode cell judged against the SLO")
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
        _title(ax, run, f"SLO attainment versus load: {slo_text}")
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
    if slo is not None:
        caps = slo_capacities(run, slo)
        if caps:
            figs["capacity_vs_load"] = capacity_vs_load(run, caps, slo.text, slo.attainment)
    cid = representative_cell(run)
    if cid:
        figs["tbt_distribution"] = tbt_distribution(run, cid)
        figs["throughput_over_time"] = throughput_over_time(run, cid)
    return figs


_XML_HEAD = re.compile(r"^.*?(?=<svg)", re.DOTALL)


def figure_to_svg(fig: Figure, id_prefix: str | None = None) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog or DOCTYPE).

    ``id_prefix`` namespaces every ``id`` (and the references to it), so that several
    charts inlined in one HTML page never share an id.
    """
    buf = io.StringIO()
    with plt.rc_context(_STYLE):
        fig.savefig(buf, format="svg")
    svg = _XML_HEAD.sub("", buf.getvalue(), count=1)
    # metadata block carries the date; drop it so reports are reproducible
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)
    if id_prefix:
        p = re.sub(r"[^A-Za-z0-9_-]", "-", id_prefix)
        svg = re.sub(r'\bid="([^"]+)"', rf'id="{p}-\1"', svg)
        svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{p}-\1)", svg)
        svg = re.sub(r'href="#([^"]+)"', rf'href="#{p}-\1"', svg)
    return svg.strip()
