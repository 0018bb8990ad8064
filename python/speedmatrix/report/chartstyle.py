"""What every chart of the report shares: matplotlib's backend and style, a figure with its
title and the run line that names the run (wrapped to the figure's width), the context axis,
the empty-chart message, and the export as inline SVG."""

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

from speedmatrix.report import formatting as fmt
from speedmatrix.report.metadata import engine_name, hardware_name, model_name

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

FLAG_COLOR = "#8e44ad"


#: CI bands are context, not the message: light enough that the lines stay readable
BAND_ALPHA = 0.07


STYLE: Any = {  # rc_context is typed with literal keys
    "svg.fonttype": "none",  # text stays text: smaller SVG, no duplicate glyph ids
    "svg.hashsalt": "speedmatrix",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def new_figure(w: float = 7.0, h: float = 4.0, layout: Any = None) -> tuple[Figure, plt.Axes]:
    """A figure with one axes; fixed margins (fast) unless a layout engine is asked for."""
    with plt.rc_context(STYLE):
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


def text_width_px(s: str, dpi: float, size: float = TITLE_PT) -> float:
    w, _h, _d = RendererAgg(1, 1, dpi).get_text_width_height_descent(
        s, FontProperties(size=size), ismath=False
    )
    return float(w)


def wrap_to_width(parts: list[str], width_px: float, dpi: float, sep: str = " · ") -> list[str]:
    """``parts`` joined by ``sep`` into as few lines as fit ``width_px`` (at ``dpi``), a part
    never split unless it alone is too wide (then at spaces, and a word too wide is cut)."""

    def fits(s: str) -> bool:
        return text_width_px(s, dpi) <= width_px

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


def set_title(ax, run: Run, title: str) -> None:
    """The chart's name and the run line (model · hardware · engine version · window) above
    the axes, wrapped to the width from the axes' left edge to the figure's right edge (a
    subtitle cut at the edge loses the version and window it exists to carry), with the room
    above the axes grown to hold every line."""
    fig = ax.get_figure()
    dpi = float(fig.dpi)
    w_in, h_in = fig.get_size_inches()
    left_in = ax.get_position().x0 * w_in if fig.get_layout_engine() is None else 0.8
    width_px = (w_in - left_in - 0.1) * dpi
    parts = [bounded(plain(p)) for p in run_line(run).split(" · ")]
    lines = wrap_to_width([bounded(plain(title), 2 * PART_CHARS)], width_px, dpi)
    lines += wrap_to_width(parts, width_px, dpi)
    ax.set_title("\n".join(lines), fontsize=TITLE_PT, loc="left", pad=TITLE_PAD_PT)
    if fig.get_layout_engine() is None:  # fixed margins: make room for the lines above
        need_in = (TITLE_PAD_PT + len(lines) * TITLE_LINE_PT + 6) / 72
        top = 1 - max(need_in, 0.6) / h_in
        if top < ax.get_position().y1:
            fig.subplots_adjust(top=top)


def bounded(s: str, n: int = PART_CHARS) -> str:
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


def context_ticks(ax, contexts) -> None:
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


def empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


XML_HEAD = re.compile(r"^.*?(?=<svg)", re.DOTALL)


def figure_to_svg(fig: Figure, id_prefix: str | None = None) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog or DOCTYPE).

    ``id_prefix`` namespaces every ``id`` (and the references to it), so that several
    charts inlined in one HTML page never share an id.
    """
    buf = io.StringIO()
    with plt.rc_context(STYLE):
        fig.savefig(buf, format="svg")
    svg = XML_HEAD.sub("", buf.getvalue(), count=1)
    # metadata block carries the date; drop it so reports are reproducible
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)
    if id_prefix:
        p = re.sub(r"[^A-Za-z0-9_-]", "-", id_prefix)
        svg = re.sub(r'\bid="([^"]+)"', rf'id="{p}-\1"', svg)
        svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{p}-\1)", svg)
        svg = re.sub(r'href="#([^"]+)"', rf'href="#{p}-\1"', svg)
    return svg.strip()
