"""``speedmatrix show DIR``: a saved run's headline grid in the terminal.

The report's "Sustained decode" grid as text: total tok/s by context × concurrency (or
request rate), and where a cell has no figure, its status, in the report's words
(``report.cells.cell_lines``, so the terminal and the report never say it two ways).
Queued and flagged cells carry a mark, explained under the grid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from speedmatrix import figures
from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import cell_flags, cell_lines, decode_cells, error_kind
from speedmatrix.report.metadata import header_lines
from speedmatrix.results import Run

#: the mark of a queued cell (the report says "Requests queued" on a second line)
QUEUED_MARK = "q"


#: the headline figures of the cells outside the decode grid (issue 23), with their formats:
#: the report's sections have them all (report/traffic.py)
OTHER_FIGURES: dict[str, tuple[tuple[str, Callable[[Any], str]], ...]] = {
    "interference": (
        ("tbt_inflation", fmt.ratio),
        ("tbt_overlap_p99_ms", fmt.ms1),
        ("tbt_clear_p99_ms", fmt.ms1),
    ),
    "session": (
        ("session_turns_per_s", fmt.one),
        ("session_output_tok_s", fmt.tok_s),
        ("session_tbt_ms", fmt.ms1),
    ),
    "trace": (
        ("total_tok_s", fmt.tok_s),
        ("queue_p50_ms", fmt.ms1),
        ("queue_p99_ms", fmt.ms1),
    ),
}


def _kind(row: pd.Series) -> str | None:
    if row.get("phase") in ("interference", "session"):
        return str(row["phase"])
    return "trace" if isinstance(row.get("trace"), str) and row["trace"] else None


def other_lines(cells: pd.DataFrame) -> list[str]:
    """A line per interference, session or trace cell: its id, headline figures, status."""
    lines = []
    for _, row in cells.iterrows():
        kind = _kind(row)
        if kind is None:
            continue
        figs = ", ".join(f"{figures.label(k)} {f(row.get(k))}" for k, f in OTHER_FIGURES[kind])
        status = fmt.status_text(row.get("status"))
        reason = row.get("reason") if row.get("status") == "error" else None
        lines.append(f"  {row['id']}: {figs}; {status}" + (f" ({reason})" if reason else ""))
    return lines


def _cell_text(status: Any, total: Any, cells: list[dict]) -> str:
    flags = cell_flags(cells)
    kind = error_kind(cells) if status == "error" else "failed"
    first = cell_lines(status, total, None, None, None, kind)[0]
    if status == "queued":
        first += f" {QUEUED_MARK}"
    if flags and status in ("valid", "queued"):
        first += f" {fmt.FLAG_MARK}"
    return first


def _grid_lines(run: Run) -> list[str]:
    """The decode grid (total tok/s, statuses) and its marks' legend."""
    tot = run.table("total_tok_s")
    st = run.statuses()
    groups = decode_cells(run)
    contexts = run.matrix_definition["contexts"]
    axis = str(tot.columns.name or "concurrency")
    header = [f"context \\ {axis}"] + [f"{c:g}" for c in tot.columns]
    rows, flagged, statuses = [], [], []
    for i, label in enumerate(tot.index):
        row = [str(label)]
        for j, load in enumerate(tot.columns):
            status = st.iat[i, j]
            statuses.append(status)
            cells = groups.get((int(contexts[i]), int(load)), []) if axis == "concurrency" else []
            row.append(_cell_text(status, tot.iat[i, j], cells))
            if cells and status in ("valid", "queued") and cell_flags(cells):
                flagged.append(f"{label} × {load:g}: {', '.join(cell_flags(cells))}")
        rows.append(row)
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    lines = ["Sustained decode, total tok/s (all streams of a cell together)"]
    for r in [header, *rows]:
        lines.append(
            "  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths)))
        )
    lines.append("")
    if "queued" in statuses:
        lines.append(f"{QUEUED_MARK} = requests queued")
    legend = fmt.legend(statuses)
    if legend:
        lines.append(legend)
    return lines + [f"{fmt.FLAG_MARK} {f}" for f in flagged]


def grid_text(run: Run, where: str = "DIR") -> str:
    """The run's title lines, its decode grid and the marks' legend, then a line per cell
    outside the grid (a run of only such cells has no grid to show); ``where``: the run's
    folder, as the resume hint names it."""
    title, subtitle, engine_line, matrix_line = header_lines(run)
    lines = [f"{title}: {subtitle}", engine_line, matrix_line, ""]
    cells = run.all_cells
    other = other_lines(cells)
    in_grid = [_kind(row) is None and row.get("phase") == "decode" for _, row in cells.iterrows()]
    if any(in_grid) or not other:
        lines += _grid_lines(run)
    if other:
        lines += [""] if lines[-1] else []
        lines.append("Interference, session and trace cells (the report has their sections)")
        lines += other
    if run.meta.get("run", {}).get("interrupted"):
        lines.append(f"The run was interrupted: continue it with speedmatrix run --resume {where}")
    return "\n".join(lines).rstrip() + "\n"
