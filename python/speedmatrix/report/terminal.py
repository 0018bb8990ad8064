"""A cell's line as the terminal prints it when the cell ends: rounded as the report rounds
figures, an absent figure as "—" (never 0), a cell without figures as its status (the run's
grid is `speedmatrix.show.grid_text`)."""

from __future__ import annotations

from speedmatrix.report import formatting as fmt


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
