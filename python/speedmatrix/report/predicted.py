"""Predicted cells in the report (issue 24): a cell the twin predicted (``predicted: true``,
`speedmatrix predict`, ``run --plan sparse``) is never shown as measured. The grid marks it
"predicted" with its interval, the tables say "(predicted)" beside its status and figures,
and the Predicted cells section says which model gave them, what it was fitted to and where
it is known to fail, beside the cells themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import load_of, ordered_cells
from speedmatrix.report.model import Section, Table

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

#: the twin's limits when a run does not carry its own (speedmatrix.twin.predictrun.LIMITS)
DEFAULT_LIMITS = (
    "predicted by the built-in engine's model; it fails for speculative decoding, "
    "prefix-cache effects and servers that preempt"
)
PREDICTED_MARK = "predicted"


def is_predicted(c: dict) -> bool:
    """Whether a cell (a run.json cell or a ``run.cells`` row) was predicted, not measured."""
    v = c.get("predicted")
    return v is True or (isinstance(v, (bool, int, float)) and not fmt.missing(v) and bool(v))


def any_predicted(cells: list[dict]) -> bool:
    return any(is_predicted(c) for c in cells)


def predicted_keys(run: Run) -> set[tuple[int, int]]:
    """(context, concurrency) of the decode cells the twin predicted: the charts mark them."""
    return {
        (int(c["context"]), int(c["concurrency"]))
        for c in ordered_cells(run)
        if c.get("phase") == "decode" and is_predicted(c)
    }


#: the charts' legend entry for a predicted point or cell
CHART_LABEL = "predicted (not measured)"


def interval(c: dict, fig: str, show: Any) -> str:
    lo, hi = c.get(f"{fig}_low"), c.get(f"{fig}_high")
    if fmt.missing(lo) or fmt.missing(hi):
        return fmt.DASH
    return f"{show(lo)}–{show(hi)}"


def grid_lines(status: str | None, cells: list[dict]) -> list[str]:
    """A predicted grid cell's stacked lines: the figure marked predicted, its interval."""
    c = next(c for c in cells if is_predicted(c))
    if status == "over_capacity":
        return ["Over capacity", PREDICTED_MARK]
    lines = [f"{fmt.tok_s(c.get('total_tok_s'))} {PREDICTED_MARK}"]
    lines.append(interval(c, "total_tok_s", fmt.tok_s))
    if status == "queued":
        lines.append("Requests queued")
    return lines


def limits(run: Run) -> str:
    pred = (run.meta.get("run") or {}).get("prediction") or {}
    return str(pred.get("limits") or DEFAULT_LIMITS)


def legend(run: Run) -> str:
    """The sentence beside a grid or table that holds predicted cells."""
    return (
        f"Cells marked {PREDICTED_MARK} were not measured: {limits(run)}; the range under the "
        "figure is its prediction interval (see Predicted cells)."
    )


def _row(c: dict) -> list[str]:
    return [
        c["label"],
        load_of(c),
        f"{fmt.status_text(c.get('status'))} ({PREDICTED_MARK})",
        fmt.tok_s(c.get("total_tok_s")),
        interval(c, "total_tok_s", fmt.tok_s),
        fmt.ms1(c.get("tbt_ms")),
        interval(c, "tbt_ms", fmt.ms1),
    ]


def predicted_section(run: Run) -> Section | None:
    """What predicted the run's predicted cells, its limits, and the cells with their
    intervals; None when every cell was measured."""
    cells = [c for c in ordered_cells(run) if is_predicted(c)]
    if not cells:
        return None
    pred = (run.meta.get("run") or {}).get("prediction") or {}
    n_decode = sum(1 for c in ordered_cells(run) if c.get("phase") == "decode")
    items = [
        ("Predicted", f"{len(cells)} of {n_decode} decode cells (not measured)"),
        ("Profile", str(pred.get("profile") or "not recorded")),
    ]
    if pred.get("fitted_to"):
        fitted = len(pred.get("fitted_cells") or [])
        items.append(("Fitted to", f"{fitted} measured cells of {pred['fitted_to']}"))
    if pred.get("what_if"):
        items.append(("What-if", ", ".join(str(x) for x in pred["what_if"])))
    items.append(("Model", "docs/metrics.md, Predicted cells"))
    cols = ["Context", "Requests at once", "Status", "Total tok/s", "Interval", "TBT", "Interval"]
    tbl = Table(
        cols,
        [_row(c) for c in cells],
        caption="Predicted by the twin, not measured; intervals at the report's confidence level",
        classes=[["txt", "", "txt", "", "sub", "", "sub"] for _ in cells],
    )
    text = [f"Where the model is known to fail: {limits(run)}."]
    return Section("Predicted cells", items=items, table=tbl, text=text, anchor="predicted-cells")
