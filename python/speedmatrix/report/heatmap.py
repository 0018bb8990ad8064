"""The sustained-decode heatmap: contexts × concurrency, each cell's figure annotated as the
report's grid writes it, over-capacity and error cells hatched, queued cells outlined and
flagged cells marked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Polygon, Rectangle

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import cell_flags, decode_cells
from speedmatrix.report.chartstyle import FLAG_COLOR, STYLE, empty, new_figure, set_title
from speedmatrix.report.predicted import CHART_LABEL, predicted_keys

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


def decode_heatmap(run: Run, figure: str = "total_tok_s") -> Figure:
    """Context × concurrency heatmap of a decode figure, annotated with the seed's numbers.

    Over-capacity cells are grey and hatched, error cells hatched red, queued
    cells get a dashed outline, cells an interrupted run never reached are blank.
    """
    with plt.rc_context(STYLE):
        vals = run.table(figure)
        st = run.statuses()
        nr, nc = vals.shape
        fig, ax = new_figure(
            max(5.0, 0.9 * nc + 2), max(2.8, 0.55 * nr + 1.6), layout="constrained"
        )
        ax.grid(False)
        if nr == 0 or nc == 0:
            empty(ax, "no decode cells")
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
                _annotate_cell(ax, i, j, st.iat[i, j], data[i, j], (cmap, norm, text_fn))
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
        set_title(ax, run, f"Sustained decode: {names.get(figure, figure)}")
        _mark_flags(ax, run, st)
        _mark_predicted(ax, run)
        fig.colorbar(im, ax=ax, shrink=0.8, label=names.get(figure, figure))
    return fig


def _patch(ax: Any, i: int, j: int, half: float, **style: Any) -> None:
    """A square of side 2 * half on grid cell (i, j): 0.5 covers it whole."""
    ax.add_patch(Rectangle((j - half, i - half), 2 * half, 2 * half, **style))


def _annotate_cell(ax, i: int, j: int, s: Any, v: float, colours: tuple[Any, Any, Any]) -> None:
    """One grid cell's mark and text: hatched when over capacity or an error, outlined when
    queued, its figure (in a colour readable on its shade) otherwise."""
    cmap, norm, text_fn = colours
    if s == "over_capacity":
        _patch(ax, i, j, 0.5, facecolor="0.85", hatch="//", edgecolor="0.6", lw=0)
        ax.text(j, i, "Over\ncapacity", ha="center", va="center", fontsize=7, color="0.3")
        return
    if s is None:
        ax.text(j, i, "not run", ha="center", va="center", fontsize=7, color="0.5")
        return
    if s == "error":
        _patch(ax, i, j, 0.5, facecolor="none", hatch="xx", edgecolor="#c0392b", lw=0)
    if s == "queued":
        _patch(ax, i, j, 0.45, facecolor="none", edgecolor="#e67e22", lw=1.5, ls="--")
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


def _mark_flags(ax, run: Run, st: Any) -> None:
    """A corner triangle on each flagged cell (a flagged figure must not read as a clean
    one), and its legend under the chart."""
    groups = decode_flags(run)
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


def _mark_predicted(ax, run: Run) -> None:
    """A dotted frame and "predicted" on each cell the twin predicted: never read as measured."""
    guessed = predicted_keys(run)
    md = run.matrix_definition
    for i, ctx in enumerate(md["contexts"]):
        for j, n in enumerate(md["concurrency"]):
            if (int(ctx), int(n)) in guessed:
                _patch(ax, i, j, 0.47, facecolor="none", edgecolor="white", lw=1.2, ls=":")
                ax.text(
                    j,
                    i + 0.33,
                    "predicted",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="black",
                    bbox={"facecolor": "white", "alpha": 0.75, "lw": 0, "pad": 0.6},
                )
    if guessed:
        ax.set_xlabel(f"simultaneous requests · dotted: {CHART_LABEL}")


def mark_predicted_points(
    ax, guessed: set[tuple[int, int]], context: int, levels: Any, xy: tuple, color: Any
) -> None:
    """A line chart's predicted points drawn hollow: never read as measured ones."""
    x, y, ok = xy
    est = ok & np.array([(context, int(float(n))) in guessed for n in levels], dtype=bool)
    if est.any():
        ax.scatter(x[est], y[est], s=36, facecolor="white", edgecolor=color, zorder=4)


def predicted_handles(guessed: set[tuple[int, int]]) -> list[Line2D]:
    """The legend entry of the hollow points, where a chart has any."""
    if not guessed:
        return []
    return [
        Line2D(
            [],
            [],
            marker="o",
            ls="",
            label=CHART_LABEL,
            markerfacecolor="white",
            markeredgecolor="0.3",
        )
    ]


def decode_flags(run: Run) -> dict[tuple[int, int], list[str]]:
    return {k: cell_flags(v) for k, v in decode_cells(run).items()}
