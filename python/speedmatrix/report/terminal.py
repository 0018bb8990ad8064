"""A run's figures as the terminal prints them: rounded as the report rounds them, an absent
figure as "—" (never 0), a cell without figures as its status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speedmatrix.report import formatting as fmt

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


def _grid_cell(v: Any) -> str:
    if isinstance(v, str):
        return v
    return fmt.tok_s(v)


def grid_text(run: Run, figure: str = "total_tok_s") -> str:
    """The decode grid of ``figure`` (`Run.status_table`) as text: ``1,583.9``, ``10.4K``,
    "Over capacity", "—"."""
    table = run.status_table(figure)
    if table.empty:
        return "No decode cell was measured."
    return table.map(_grid_cell).to_string()


def cell_summary(cell: dict) -> str:
    """The line printed when a cell ends: its headline figures, each "—" when absent."""
    status = str(cell.get("status") or "")
    if cell.get("phase") == "prefill":
        if fmt.missing(cell.get("prompt_tok_s")):
            return status
        return f"{fmt.tok_s_short(cell['prompt_tok_s'])} prompt tok/s, TTFT {fmt.ms(cell.get('ttft_ms'))}"
    if fmt.missing(cell.get("total_tok_s")):
        reason = cell.get("reason")
        return status + (f" ({reason})" if not fmt.missing(reason) else "")
    s = (
        f"{fmt.tok_s(cell['total_tok_s'])} tok/s, TTFT {fmt.ms(cell.get('ttft_ms'))}, "
        f"TBT {fmt.ms1(cell.get('tbt_ms'))}"
    )
    return s if status == "valid" else f"{s} [{status}]"
