"""`speedmatrix show DIR` (issue 21): a saved run's headline grid in the terminal, total
tok/s by context × concurrency with the status of every cell without a figure, as the
report's Sustained decode table says it."""

from __future__ import annotations

import shutil

from speedmatrix import cli
from speedmatrix.report import formatting as fmt
from speedmatrix.results import load
from synthetic import BUSY_CELL, DRIFT_CELL, ERROR_CELL, shared_run


def _grid(text: str) -> dict[str, list[str]]:
    """Rows of the printed grid by context label, cells split on two or more spaces."""
    import re

    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("context \\ "))
    rows = {}
    for ln in lines[start:]:
        if not ln.strip():
            break
        parts = re.split(r"\s{2,}", ln.strip())
        rows[parts[0]] = parts[1:]
    return rows


def test_show_prints_the_grid_with_figures_and_statuses(capsys):
    d = shared_run("full")
    assert cli.main(["show", str(d)]) == 0
    out = capsys.readouterr().out
    rows = _grid(out)
    run = load(d)
    tot, st = run.table("total_tok_s"), run.statuses()
    assert rows["context \\ concurrency"] == [f"{c:g}" for c in tot.columns]
    assert list(rows)[1:] == list(tot.index)
    for i, label in enumerate(tot.index):
        for j, _n in enumerate(tot.columns):
            text, status = rows[label][j], st.iat[i, j]
            if status in ("valid", "queued"):
                assert text.split()[0] == fmt.tok_s(tot.iat[i, j])
                assert ("q" in text.split()) == (status == "queued")
            else:
                assert text == {"over_capacity": "Over capacity", "error": "Error"}[status]
    cols = list(tot.columns)
    ctx = dict(zip(run.matrix_definition["contexts"], tot.index))
    assert rows[ctx[ERROR_CELL[0]]][cols.index(ERROR_CELL[1])] == "Error"
    assert rows[ctx[DRIFT_CELL[0]]][cols.index(DRIFT_CELL[1])].endswith(fmt.FLAG_MARK)
    assert f"{fmt.FLAG_MARK} {ctx[BUSY_CELL[0]]} × {BUSY_CELL[1]}: busy_at_start" in out
    assert "q = requests queued" in out and "Over capacity:" in out
    assert out.splitlines()[0].startswith("Speed test matrix: Muse-Glimmer-30B")


def test_show_of_an_interrupted_run_says_what_was_not_measured(capsys):
    d = shared_run("interrupted")
    assert cli.main(["show", str(d)]) == 0
    out = capsys.readouterr().out
    assert "Not measured" in _grid(out)["123K"]
    assert f"speedmatrix run --resume {d}" in out


def test_show_without_a_run_or_with_a_damaged_one_is_one_line(tmp_path, capsys):
    assert cli.main(["show", str(tmp_path)]) == cli.EXIT_USAGE
    assert "holds no run.json" in capsys.readouterr().err
    bad = tmp_path / "bad"
    shutil.copytree(shared_run("norecords"), bad)
    (bad / "run.json").write_text("{not json")
    assert cli.main(["show", str(bad)]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err


def test_show_needs_no_records(capsys):
    """run.json alone (records not copied) is enough: the grid is read from the cells."""
    assert cli.main(["show", str(shared_run("norecords"))]) == 0
    assert "Over capacity" in capsys.readouterr().out


def test_show_lists_the_cells_outside_the_grid_with_their_headline_figures():
    import pandas as pd
    from speedmatrix.show import other_lines

    cells = pd.DataFrame(
        [
            {"id": "decode-c1024-n2-r0", "phase": "decode", "status": "valid", "trace": None},
            {
                "id": "interference-c2048-n2-r0",
                "phase": "interference",
                "status": "valid",
                "tbt_inflation": 5.1,
                "tbt_overlap_p99_ms": 102.0,
                "tbt_clear_p99_ms": 20.0,
            },
            {
                "id": "session-c256-n2-t3-r0",
                "phase": "session",
                "status": "error",
                "reason": "turn 2 failed",
                "session_turns_per_s": None,
            },
            {
                "id": "trace-r0",
                "phase": "decode",
                "trace": "/t/mooncake.jsonl",
                "status": "valid",
                "total_tok_s": 1583.94,
                "queue_p50_ms": 0.4,
                "queue_p99_ms": 7.25,
            },
        ]
    )
    lines = other_lines(cells)
    assert len(lines) == 3  # the decode cell is the grid's
    assert lines[0].startswith("  interference-c2048-n2-r0: TBT inflation 5.10×")
    assert "TBT p99 during prefills 102.0 ms" in lines[0] and lines[0].endswith("Valid")
    assert "Turns/s —" in lines[1] and lines[1].endswith("(turn 2 failed)")
    assert "1,583.9" in lines[2] and "7.2 ms" in lines[2]
    assert other_lines(cells.iloc[:1]) == []
