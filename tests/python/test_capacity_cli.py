"""`speedmatrix capacity DIR --slo ...` and the open-loop/SLO flags of `run` (in process)."""

from __future__ import annotations

import json

import pytest
import synthetic
from speedmatrix import cli
from speedmatrix.cli import run as cli_run
from speedmatrix.results import load


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cap") / "run"
    synthetic.build_run(
        d, contexts=(8192, 32768), concurrency=(1, 4, 16, 64), prefill_contexts=(), duration_s=2.0
    )
    return d


def test_capacity_prints_a_table_judged_from_the_records(run_dir, capsys):
    run = load(run_dir)
    # A TBT target between the fastest and slowest cells' streams splits the loads.
    tbt = sorted(c["tbt_ms"] for c in run.doc["cells"] if c.get("tbt_ms"))
    target = f"tpot={(tbt[0] + tbt[-1]) / 2:.3f}ms"
    assert cli.main(["capacity", str(run_dir), "--slo", target, "--attainment", "90%"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith(f"Capacity at SLO {target.replace('.000', '')}") or "Capacity at SLO" in out
    )
    caps = run.capacity(target, "90%")
    assert set(caps) == {8192, 32768}
    for cap in caps.values():
        line = next(x for x in out.splitlines() if x.startswith(f"| {cap['label']} |"))
        assert f"| {cap['passing']:g} |" in line if cap["passing"] else "| — |" in line
    # at least one context has a measured boundary, so the table says something
    assert any(c["passing"] and c["failing"] for c in caps.values())
    assert cli.main(["capacity", str(run_dir), "--slo", target, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"8192", "32768"}


@pytest.mark.parametrize(
    "args, says",
    [
        (["--slo", "speed=2s"], "NAME=DURATION"),
        (["--slo", "ttft=2s", "--attainment", "150%"], "between 0 and 100%"),
    ],
)
def test_capacity_bad_flags_are_one_line_exit_2(run_dir, capsys, args, says):
    assert cli.main(["capacity", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_capacity_of_a_folder_without_a_run(tmp_path, capsys):
    assert cli.main(["capacity", str(tmp_path), "--slo", "ttft=1s"]) == 2
    assert "holds no run.json" in capsys.readouterr().err


def test_open_loop_flags_reach_the_matrix():
    args = cli.build_parser().parse_args(
        [
            "run",
            "--request-rate",
            "0.5,2",
            "--arrival",
            "gamma:0.5",
            "--max-concurrency",
            "32",
            "--percentiles",
            "50,99",
            "--slo",
            "ttft=2s,tpot=50ms",
            "--attainment",
            "90",
            "--drain-timeout",
            "30s",
        ]
    )
    m = cli_run.matrix_from_args(args)
    assert m.request_rates == [0.5, 2.0] and m.arrival == "gamma:0.5"
    assert m.max_concurrency == 32 and m.percentiles == [50.0, 99.0]
    assert m.slo == {"ttft": 2000.0, "tpot": 50.0} and m.attainment == pytest.approx(0.9)
    assert m.drain_timeout_s == 30.0


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--request-rate", "1,fast"], "--request-rate: 'fast' is not a number"),
        (["--arrival", "weibull"], "--arrival:"),
        (["--max-concurrency", "0"], "--max-concurrency: 0 is not a positive integer"),
        (["--slo", "ttft"], "NAME=DURATION"),
        (["--percentiles", "150"], "between 0 and 100"),
    ],
)
def test_open_loop_flags_refuse_bad_values(flags, says):
    args = cli.build_parser().parse_args(["run", *flags])
    with pytest.raises(cli.UsageError, match=says):
        cli_run.matrix_from_args(args)
