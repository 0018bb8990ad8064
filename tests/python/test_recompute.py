"""A saved run's cells rebuilt from their records (speedmatrix.recompute, Run.recompute,
`speedmatrix recompute`): the same cells with the saved rules, only flags and statuses
changed with other thresholds, and runs saved before the facts were fall back and say so."""

from __future__ import annotations

import json

import pytest
from speedmatrix import cli, runfile
from speedmatrix.matrix import Matrix
from speedmatrix.recompute import recompute_doc
from speedmatrix.results import load
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep
from speedmatrix.verdict import Rules


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("recompute")
    with Sim("fixed", stamp=True) as sim:
        m = Matrix(
            contexts=[256],
            concurrency=[1, 4],
            duration_s=1.5,
            max_output=200,
            prefill_contexts=[256, 512],
        )
        assert Sweep(sim.url, m, out, progress=False, report=False).execute() == 0
    return out


def _doc(out):
    return json.loads((out / "run.json").read_text())


def test_saved_run_recomputed_equals_the_original(saved):
    doc = runfile.read_run(saved)
    assert doc["meta"]["verdict"]["rules"] == Rules().to_dict()
    measured = [c for c in doc["cells"] if c.get("records")]
    assert {c["phase"] for c in measured} == {"prefill", "decode"}
    assert any(c.get("measured_in") for c in measured)  # a prefill from a warm-up
    out = recompute_doc(doc, saved)
    assert out.notes == []
    assert out.changed == []
    assert out.doc["cells"] == doc["cells"]
    run = load(saved).recompute()
    assert run.doc["cells"] == doc["cells"] and run.changed == []


def test_changed_threshold_changes_flags_and_nothing_else(saved):
    doc = runfile.read_run(saved)
    out = recompute_doc(doc, saved, changes={"client_bound_cpu_share": 0.0})
    decode = [c["id"] for c in doc["cells"] if c["phase"] == "decode"]
    assert sorted(out.changed) == sorted(decode)
    old = {c["id"]: c for c in doc["cells"]}
    for cell in out.doc["cells"]:
        was = old[cell["id"]]
        if cell["id"] in decode:
            assert cell["flags"] == was["flags"] + ["client_bound"]
        assert {k: v for k, v in cell.items() if k != "flags"} == {
            k: v for k, v in was.items() if k != "flags"
        }
    assert out.doc["meta"]["verdict"]["rules"]["client_bound_cpu_share"] == 0.0


def test_error_threshold_changes_status(saved):
    # a threshold below zero makes every decode cell with a started request an error? no:
    # errors_total 0 is never > 0 x started, so the status stays; nothing changes
    doc = runfile.read_run(saved)
    assert recompute_doc(doc, saved, changes={"error_threshold": 0.0}).changed == []
    out = recompute_doc(doc, saved, changes={"error_threshold": -1.0})
    decode = {c["id"] for c in doc["cells"] if c["phase"] == "decode"}
    assert set(out.changed) == decode
    for cell in out.doc["cells"]:
        if cell["id"] in decode:
            assert cell["status"] == "error"
            assert cell["total_tok_s"] == next(
                c["total_tok_s"] for c in doc["cells"] if c["id"] == cell["id"]
            )


def test_unknown_rule_is_a_clear_error(saved):
    with pytest.raises(KeyError, match="no rule 'nope'"):
        recompute_doc(runfile.read_run(saved), saved, changes={"nope": 1})
    assert cli.main(["recompute", str(saved), "--rule", "nope=1"]) == cli.EXIT_USAGE
    assert cli.main(["recompute", str(saved), "--rule", "ramp_share"]) == cli.EXIT_USAGE


def test_run_saved_before_the_facts_falls_back_and_says_so(saved, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(saved, old)
    doc = runfile.read_run(old)
    doc["meta"].pop("verdict")
    runfile.write_run(old, doc)
    # records saved without their stamps (as before they were stored)
    for cell in doc["cells"]:
        if cell.get("records"):
            rec = runfile.load_records(old, cell["records"])
            runfile.save_records(old, cell["id"], rec["requests"], rec["events"], rec["metrics"])
    out = recompute_doc(doc, old)
    assert any("default thresholds" in n for n in out.notes)
    assert any("clock stamps" in n for n in out.notes)
    assert out.doc["cells"] == doc["cells"]


def test_cli_recompute_reports_changes_and_writes_only_when_asked(saved, tmp_path, capsys):
    import shutil

    d = tmp_path / "run"
    shutil.copytree(saved, d)
    before = (d / "run.json").read_text()
    assert cli.main(["recompute", str(d)]) == 0
    assert "0 of" in capsys.readouterr().out
    assert cli.main(["recompute", str(d), "--rule", "client_bound_cpu_share=0"]) == 0
    text = capsys.readouterr().out
    assert "+client_bound" in text and "wrote" not in text
    assert (d / "run.json").read_text() == before
    assert cli.main(["recompute", str(d), "--rule", "client_bound_cpu_share=0", "--write"]) == 0
    assert all("client_bound" in c["flags"] for c in _doc(d)["cells"] if c["phase"] == "decode")
