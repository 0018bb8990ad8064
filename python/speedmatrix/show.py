"""``speedmatrix show DIR``: a saved run's headline grid in the terminal.

The report's "Sustained decode" grid as text: total tok/s by context × concurrency (or
request rate), and where a cell has no figure, its status, in the report's words
(``report.cells.cell_lines``, so the terminal and the report never say it two ways).
Queued and flagged cells carry a mark, explained under the grid.
"""

from __future__ import annotations

from typing import Any

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import cell_flags, cell_lines, decode_cells, error_kind
from speedmatrix.report.metadata import header_lines
from speedmatrix.results import Run

#: the mark of a queued cell (the report says "Requests queued" on a second line)
QUEUED_MARK = "q"


def _cell_text(status: Any, total: Any, cells: list[dict]) -> str:
    flags = cell_flags(cells)
    kind = error_kind(cells) if status == "error" else "failed"
    first = cell_lines(status, total, None, None, None, kind)[0]
    if status == "queued":
        first += f" {QUEUED_MARK}"
    if flags and status in ("valid", "queued"):
        first += f" {fmt.FLAG_MARK}"
    return first


def grid_text(run: Run, where: str = "DIR") -> str:
    """The run's title lines, its decode grid (total tok/s, statuses) and the marks' legend;
    ``where``: the run's folder, as the resume hint names it."""
    title, subtitle, engine_line, matrix_line = header_lines(run)
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
    lines = [f"{title}: {subtitle}", engine_line, matrix_line, ""]
    lines.append("Sustained decode, total tok/s (all streams of a cell together)")
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
    lines += [f"{fmt.FLAG_MARK} {f}" for f in flagged]
    if run.meta.get("run", {}).get("interrupted"):
        lines.append(f"The run was interrupted: continue it with speedmatrix run --resume {where}")
    return "\n".join(lines).rstrip() + "\n"
