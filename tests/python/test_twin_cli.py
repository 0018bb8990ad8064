"""`speedmatrix predict`: the what-if flag changes the status, bad input is one line."""

from __future__ import annotations

import json

import pytest
from speedmatrix.cli import main


def _cells(capsys, *extra: str) -> list[dict]:
    rc = main(
        ["predict", "seed-h200", "--contexts", "123K", "--concurrency", "16", "--json", *extra]
    )
    assert rc == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_twice_the_kv_pool_lifts_a_cell_out_of_over_capacity(capsys) -> None:
    (before,) = _cells(capsys)
    (after,) = _cells(capsys, "--set", "kv_tokens=2x")
    assert before["status"] == "over_capacity" and before["total_tok_s"] is None
    assert after["status"] == "valid" and after["predicted"] is True
    assert after["total_tok_s_low"] <= after["total_tok_s"] <= after["total_tok_s_high"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--contexts", "8K", "--concurrency", "x"],
        ["--contexts", "8K", "--concurrency", "1", "--set", "nosuch=2"],
        ["--contexts", "8K", "--concurrency", "1", "--set", "kv_tokens=lots"],
    ],
)
def test_bad_input_is_one_clear_line(capsys, argv) -> None:
    assert main(["predict", "seed-h200", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("speedmatrix: error:")
