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
