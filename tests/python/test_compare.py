"""Comparing two runs: ratios, significance beyond the intervals, status changes, outputs."""

import json

import numpy as np
import pandas as pd
import pytest
import synthetic
from speedmatrix.report.compare import compare, t_critical, welch, write_compare
from speedmatrix.results import load
from speedmatrix.runfile import write_run


@pytest.fixture(scope="module")
def runs():
    return load(synthetic.shared_run("full")), load(synthetic.shared_run("faster"))


def test_faster_build_is_seen_as_faster(runs):
    a, b = runs
    df = compare(a, b)
    dec = df[(df["phase"] == "decode") & (df["status_a"] != "over_capacity")]
    assert len(dec) == int(
        ((a.cells["phase"] == "decode") & (a.cells["status"] != "over_capacity")).sum()
    )
    assert dec["total_tok_s_ratio"].median() == pytest.approx(1.1, rel=0.02)
    sig = dec["total_tok_s_significant"]
    # non-overlapping 95% intervals is a strict test on 8 s windows: a third of the cells at least
    assert sig.sum() >= len(dec) // 3
    assert (dec.loc[sig.fillna(False).astype(bool), "total_tok_s_better"] == True).all()
    assert set(dec["total_tok_s_method"]) == {"ci"}
    pre = df[df["phase"] == "prefill"]
    assert (pre["ttft_ms_ratio"] < 0.95).all()  # prefill faster: lower TTFT
    assert not df["status_changed"].any()
    over = df[df["status_a"] == "over_capacity"]
    assert over["total_tok_s_ratio"].isna().all()


def test_same_run_has_no_significant_difference(runs):
    a, _ = runs
    df = compare(a, a)
    dec = df[df["phase"] == "decode"]
    assert np.allclose(dec["total_tok_s_ratio"].dropna(), 1.0)
    assert not dec["total_tok_s_significant"].fillna(False).astype(bool).any()


def test_status_changes_and_missing_cells(tmp_path, runs):
    a, _ = runs
    doc = json.loads((synthetic.shared_run("full") / "run.json").read_text())
    for c in doc["cells"]:
        if c.get("id") == "decode-c8192-n4-r0":
            c["status"] = "error"
    doc["cells"] = [c for c in doc["cells"] if c.get("id") != "decode-c8192-n1-r0"]
    write_run(tmp_path, doc)
    b = load(tmp_path)
    df = compare(a, b).set_index(["phase", "context", "concurrency"])
    assert df.loc[("decode", 8192, 4), "status_changed"]
    assert df.loc[("decode", 8192, 4), "status_b"] == "error"
    gone = df.loc[("decode", 8192, 1)]
    assert gone["status_changed"] and pd.isna(gone["status_b"])
    assert np.isnan(gone["total_tok_s_b"])


def test_welch_when_intervals_are_missing(tmp_path, runs):
    a, _ = runs
    fast = synthetic.shared_run("faster")
    doc = json.loads((fast / "run.json").read_text())
    for c in doc["cells"]:
        c.pop("ci", None)
    d = tmp_path / "noci"
    write_run(d, doc)
    (d / "records").symlink_to(fast / "records")
    b = load(d)
    df = compare(a, b)
    dec = df[(df["phase"] == "decode") & df["total_tok_s_b"].notna()]
    assert set(dec["total_tok_s_method"]) == {"welch"}
    assert dec["total_tok_s_significant"].sum() >= 1


def test_t_critical_and_welch():
    assert t_critical(1) == pytest.approx(12.706)
    assert t_critical(10) == pytest.approx(2.228)
    assert t_critical(11) == pytest.approx((2.228 + 2.179) / 2)
    assert t_critical(1000) == 1.96
    rng = np.random.default_rng(3)
    x, y = rng.normal(100, 5, 30), rng.normal(100, 5, 30)
    assert not welch(x, y)[2]
    t, df, sig = welch(x, y + 20)
    assert sig and t > 10 and 50 < df < 60
    assert not welch([1.0], [2.0])[2]


@pytest.mark.e2e  # a whole comparison report with its charts
def test_write_compare_outputs(tmp_path):
    md_path, html_path = write_compare(
        synthetic.shared_run("full"), synthetic.shared_run("faster"), tmp_path / "cmp"
    )
    md = md_path.read_text()
    page = html_path.read_text()
    for s in (
        "## Runs",
        "## Sustained decode",
        "## Prefill",
        "## Status changes",
        "## All measurements",
    ):
        assert s in md
    assert md.index("## Runs") < md.index("## Sustained decode") < md.index("## Prefill")
    assert "sglang 0.5.7 versus sglang 0.5.6.post3.dev9265+g05c584c44" in md
    assert "1.10× ▲" in md or "1.11× ▲" in md or "1.09× ▲" in md
    assert "No cell changed status." in md
    assert "Over capacity" in md
    assert page.count("<svg") >= 2 and "<script" not in page
    assert (tmp_path / "cmp" / "compare.csv").is_file()
    md2, _ = write_compare(
        synthetic.shared_run("full"),
        synthetic.shared_run("interrupted"),
        tmp_path / "cmp2",
        charts=False,
    )
    text = md2.read_text()
    assert "Not measured" in text  # cells the interrupted run never reached
