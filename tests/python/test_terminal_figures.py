"""Figures printed on the terminal (the demo's closing grid, the line at each cell's end):
rounded as the report rounds them, and an absent figure printed as absent ("—"), never 0."""

from __future__ import annotations

import pytest
import synthetic
from speedmatrix.report.terminal import cell_summary
from speedmatrix.results import load
from speedmatrix.runfile import read_run, write_run
from speedmatrix.show import grid_text


def test_the_grid_is_rounded_and_says_each_status(tmp_path):
    synthetic.build_run(
        tmp_path, contexts=(8192,), concurrency=(1, 2), prefill_contexts=(), with_records=False
    )
    doc = read_run(tmp_path)
    cells = [c for c in doc["cells"] if c["phase"] == "decode"]
    cells[0].update(status="valid", total_tok_s=116.66666666)
    cells[1].update(status="over_capacity", total_tok_s=None)
    write_run(tmp_path, doc)
    text = grid_text(load(tmp_path))
    assert "116.7" in text and "116.666" not in text
    assert "Over capacity" in text


@pytest.mark.parametrize(
    ("cell", "line"),
    [
        (
            {"phase": "decode", "status": "valid", "total_tok_s": 1583.94, "ttft_ms": None,
             "tbt_ms": None},
            "1,583.9 tok/s, TTFT —, TBT —",
        ),
        (
            {"phase": "decode", "status": "queued", "total_tok_s": 12345.6, "ttft_ms": 790.2,
             "tbt_ms": 16.84},
            "12.3K tok/s, TTFT 790 ms, TBT 16.8 ms [queued]",
        ),
        (
            {"phase": "decode", "status": "error", "total_tok_s": None, "reason": "3 failed"},
            "error (3 failed)",
        ),
        (
            {"phase": "prefill", "status": "valid", "prompt_tok_s": 9995.2, "ttft_ms": None},
            "9,995 prompt tok/s, TTFT —",
        ),
        ({"phase": "prefill", "status": "error", "prompt_tok_s": None}, "error"),
    ],
)  # fmt: skip
def test_a_cell_line_prints_absent_figures_as_absent(cell, line):
    assert cell_summary(cell) == line


@pytest.mark.parametrize(
    ("total", "shown"), [(None, "—"), (float("nan"), "—"), (116.6666, "116.7"), (12345.6, "12.3K")]
)
def test_the_live_grid_prints_an_absent_figure_as_absent(total, shown):
    from speedmatrix.progress import cell_text

    assert cell_text({"status": "valid", "total_tok_s": total})[0] == shown
