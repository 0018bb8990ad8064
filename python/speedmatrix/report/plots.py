"""Charts of a run (matplotlib, Agg backend). Each function returns a Figure.

from speedmatrix.report import plots
fig = plots.decode_heatmap(run)
svg = plots.figure_to_svg(fig)        # inline SVG for HTML
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
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from speedmatrix.report import formatting as fmt

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

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
            fig.subplots_adjust(left=0.8 / w, right=1 - 0.25 / w, bottom=0.55 / h, top=1 - 0.35 / h)
        ax = fig.add_subplot()
    return fig, ax


def _context_ticks(ax, contexts) -> None:
    """Context ticks on a log2 axis; labels closer than ~10% to the previous one are left blank."""
    xs = sorted({float(c) for c in contexts})
    labels, last = [], None
    for x in xs:
        if last is not None and np.log2(x / last) < 0.15:
            labels.append("")
            continue
        labels.append(fmt.context_label(x))
        last = x
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
        vals = run.matrix(figure, numeric=True)
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
        ax.set_title(f"Sustained decode: {names.get(figure, figure)}")
        fig.colorbar(im, ax=ax, shrink=0.8, label=names.get(figure, figure))
    return fig


def _decode_lines(run: Run, figure: str, ylabel: str, title: str, logy: bool) -> Figure:
    with plt.rc_context(_STYLE):
        fig, ax = _new()
        vals = run.matrix(figure, numeric=True)
        cells = run.cells
        dec = cells[cells["phase"] == "decode"] if "phase" in cells else cells
        lo_col, hi_col = f"{figure}_lo", f"{figure}_hi"
        plotted = False
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
            if lo_col in sub and sub[lo_col].notna().any():
                sub = sub.sort_values("concurrency")
                lo = sub[lo_col].to_numpy(float)
                hi = sub[hi_col].to_numpy(float)
                bad = ~(np.isfinite(lo) & np.isfinite(hi)) | (lo <= 0)  # too few bins: no band
                lo, hi = np.where(bad, np.nan, lo), np.where(bad, np.nan, hi)
                ax.fill_between(
                    sub["concurrency"].to_numpy(float), lo, hi, color=colors[k], alpha=0.15, lw=0
                )
            q = dec[(dec["context"] == ctx) & (dec["status"] == "queued")] if len(dec) else dec
            if len(q) and figure in q:
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
        ax.set_xlabel("simultaneous requests")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(title="context", fontsize=8, ncols=2 if len(vals) > 6 else 1)
    return fig


def total_vs_concurrency(run: Run) -> Figure:
    """Total tok/s versus simultaneous requests, one line per context (95% CI bands)."""
    return _decode_lines(run, "total_tok_s", "total tok/s", "Total throughput", logy=True)


def per_request_vs_concurrency(run: Run) -> Figure:
    """Per-request tok/s versus simultaneous requests, one line per context."""
    return _decode_lines(
        run, "per_request_tok_s", "per request tok/s", "Per-request speed", logy=False
    )


def ttft_vs_context(run: Run) -> Figure:
    """Warm TTFT of decode cells versus context (one line per concurrency) and cold prefill TTFT."""
    with plt.rc_context(_STYLE):
        fig, ax = _new()
        vals = run.matrix("ttft_ms", numeric=True)
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
        ax.set_title("Time to first token")
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
        ax.set_title("Prefill speed")
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
        ax.set_title(f"Time between tokens: {cell_id}")
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
        ax.step(np.arange(b.size) * bin_s, b, where="post", color="#6a51a3")
        ax.set_xlabel("seconds into the window")
        ax.set_ylabel("tok/s")
        ax.set_title(f"Throughput across the window: {cell_id}")
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


def all_figures(run: Run) -> dict[str, Figure]:
    """The report's charts, by name."""
    figs = {
        "decode_heatmap": decode_heatmap(run),
        "total_vs_concurrency": total_vs_concurrency(run),
        "per_request_vs_concurrency": per_request_vs_concurrency(run),
        "ttft_vs_context": ttft_vs_context(run),
        "prefill_vs_context": prefill_vs_context(run),
    }
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
