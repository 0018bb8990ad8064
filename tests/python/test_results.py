"""Saved runs as objects: frames, the matrix pivot, records, interrupted runs, metadata."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import synthetic
from speedmatrix import results
from speedmatrix.hardware import detect_hardware, parse_gb, query_gpus, vram_gb_from_mib
from speedmatrix.runfile import RunFileError

LABELS = ["8K", "16K", "32K", "64K", "123K"]


@pytest.fixture(scope="module")
def run():
    return results.load(synthetic.shared_run("full"))


@pytest.fixture(scope="module")
def doc():
    return json.loads((synthetic.shared_run("full") / "run.json").read_text())


def test_cells_frame_has_every_field_and_split_intervals(run, doc):
    cells = run.cells
    assert len(cells) == len(doc["cells"])
    for c in doc["cells"]:
        for k in c:
            if k not in ("ci", "server", "prompt_tokens"):
                assert k in cells.columns, k
    for col in (
        "total_tok_s_lo",
        "total_tok_s_hi",
        "ttft_ms_lo",
        "tbt_ms_hi",
        "server_waiting_max",
        "prompt_tokens_asked",
    ):
        assert col in cells.columns
    row = cells.set_index("id").loc["decode-c8192-n4-r0"]
    src = next(c for c in doc["cells"] if c["id"] == "decode-c8192-n4-r0")
    assert row["total_tok_s"] == pytest.approx(src["total_tok_s"])
    assert row["total_tok_s_lo"] == pytest.approx(src["ci"]["total_tok_s"][0])
    assert row["total_tok_s_lo"] < row["total_tok_s"] < row["total_tok_s_hi"]


def test_matrix_is_the_seed_table(run, doc):
    m = run.matrix("total_tok_s")
    assert list(m.index) == LABELS
    assert list(m.columns) == [1, 2, 4, 8, 16, 32, 64, 128]
    over = [(c["label"], c["concurrency"]) for c in doc["cells"] if c["status"] == "over_capacity"]
    assert over and all(m.loc[lab, n] == "Over capacity" for lab, n in over)
    src = {(c["label"], c["concurrency"]): c for c in doc["cells"] if c["phase"] == "decode"}
    assert m.loc["8K", 64] == pytest.approx(src[("8K", 64)]["total_tok_s"])  # queued keeps it
    numeric = run.matrix("total_tok_s", numeric=True)
    assert numeric.dtypes.map(lambda d: d.kind == "f").all()
    assert np.isnan(numeric.loc["123K", 16])
    assert run.matrix("ttft").loc["8K", 1] == pytest.approx(src[("8K", 1)]["ttft_ms"])
    with pytest.raises(KeyError):
        run.matrix("no_such_figure")


def test_statuses_and_prefill(run):
    st = run.statuses()
    assert st.loc["8K", 64] == "queued" and st.loc["32K", 16] == "error"
    assert st.loc["8K", 128] == "over_capacity" and st.loc["8K", 1] == "valid"
    pre = run.prefill()
    assert pre["label"].tolist() == ["8K", "16K", "32K", "64K", "123K", "128K"]
    assert (pre["prompt_tok_s"].diff().dropna() < 0).all()  # prefill slows with context
    assert pre["prompt_tok_s"].iloc[0] == pytest.approx(8192 / (pre["ttft_ms"].iloc[0] / 1000))


def test_requests_are_relative_to_t0(run):
    r = run.requests
    cell = r[r["cell"] == "decode-c8192-n4-r0"]
    win = cell[cell["phase"] == "window"]
    assert len(win) == 4 and (win["sent_ms"].abs() < 1).all()
    assert (cell[cell["phase"] == "warmup"]["sent_ms"] < 0).all()
    assert (win["ttft_ms"] > 0).all()
    assert set(r["outcome"]) <= {"ok", "cancelled", "error", "pending"}
    err = r[r["cell"] == "decode-c32768-n16-r0"]
    assert (err["error_kind"] == "http_500").any()
    assert {"context", "concurrency", "tok_s"} <= set(r.columns)


def test_token_records_agree_with_figures(run):
    cid = "decode-c16384-n8-r0"
    c = run.cells.set_index("id").loc[cid]
    tok = run.tokens(cid)
    assert {"request", "t_ms", "tokens", "gap_ms", "in_window"} <= set(tok.columns)
    assert tok["t_ms"].is_monotonic_increasing
    assert tok.loc[tok["in_window"], "tokens"].sum() == c["output_tokens"]
    assert np.median(run.tbt_samples(cid)) == pytest.approx(c["tbt_ms"])
    bins = run.bins(cid)
    assert len(bins) == round(c["measured_s"])
    assert bins.mean() == pytest.approx(c["total_tok_s"], rel=1e-6)
    met = run.server_metrics(cid)
    assert "sglang:num_running_reqs" in met.columns and met["t_ms"].min() < 0


def test_concat_adds_a_run_column(run):
    other = results.load(synthetic.shared_run("faster"))
    both = results.concat([run, other], ["before", "after"])
    assert len(both) == len(run.cells) + len(other.cells)
    assert list(both["run"].cat.categories) == ["before", "after"]
    piv = both[both["phase"] == "decode"].pivot_table(
        index=["context", "concurrency"], columns="run", values="total_tok_s", observed=True
    )
    assert (piv["after"] / piv["before"]).median() == pytest.approx(1.1, rel=0.03)
    pre = results.concat([run, other], ["a", "b"], frame="prefill")
    assert len(pre) == 12
    with pytest.raises(ValueError):
        results.concat([run], ["a", "b"])


def test_concat_of_token_events(run):
    other = results.load(synthetic.shared_run("faster"))
    toks = results.concat([run, other], ["before", "after"], frame="tokens")
    cid = "decode-c8192-n4-r0"
    one = toks[(toks["run"] == "before") & (toks["cell"] == cid)]
    assert len(one) == len(run.tokens(cid)) > 0
    assert np.array_equal(one["t_ms"].to_numpy(), run.tokens(cid)["t_ms"].to_numpy())
    assert set(one["context"]) == {8192} and set(one["concurrency"]) == {4}
    assert set(toks["run"]) == {"before", "after"}
    # the decode cells' in-window tokens are the cells' output tokens
    win = toks[(toks["run"] == "before") & toks["in_window"] & (toks["cell_phase"] == "decode")]
    per_cell = win.groupby("cell")["tokens"].sum()
    cells = run.cells.set_index("id")
    assert per_cell[cid] == cells.loc[cid, "output_tokens"]
    with pytest.raises(ValueError, match="frame: 'bogus' is not one of cells, requests"):
        results.concat([run], frame="bogus")


def test_matrix_agrees_with_the_report_on_error_cells(run, tmp_path):
    from speedmatrix.report import render_report

    src = run.cell("decode-c32768-n16-r0")
    assert src["status"] == "error" and src["total_tok_s"] is not None  # it has a figure
    assert run.matrix("total_tok_s").loc["32K", 16] == "Error"  # as the report prints
    assert np.isnan(run.matrix("total_tok_s", numeric=True).loc["32K", 16])
    assert run.matrix("errors_total", all_cells=True).loc["32K", 16] == sum(src["errors"].values())
    md, _, _ = render_report(run, charts=False)
    row = next(ln for ln in md.splitlines() if ln.startswith("| 32K |"))
    assert row.split("|")[6].strip().startswith("Error<br>")
    # a repeated cell with one failed repetition keeps the valid one's figure
    doc = json.loads((synthetic.shared_run("full") / "run.json").read_text())
    ok = next(c for c in doc["cells"] if c["id"] == "decode-c8192-n1-r0")
    doc["cells"].append(
        dict(ok, id="decode-c8192-n1-r1", repetition=1, status="queued", total_tok_s=1.0)
    )
    doc["cells"].append(
        dict(ok, id="decode-c8192-n1-r2", repetition=2, status="error", total_tok_s=1e6)
    )
    (tmp_path / "run.json").write_text(json.dumps(doc))
    rep = results.load(tmp_path)
    assert rep.statuses().loc["8K", 1] == "queued"
    assert rep.matrix("total_tok_s").loc["8K", 1] == pytest.approx(
        (ok["total_tok_s"] + 1.0) / 2
    )  # median of the valid and the queued repetition


def test_interrupted_run(tmp_path):
    r = results.load(synthetic.shared_run("interrupted"))
    assert r.interrupted
    m = r.matrix("total_tok_s")
    assert list(m.index) == LABELS
    assert (m == "Not measured").to_numpy().sum() == len(
        [x for x in r.missing_cells() if x[0] == "decode"]
    )
    assert r.missing_cells()
    assert r.statuses().isna().to_numpy().sum() > 0
    assert "interrupted" in repr(r)


def test_run_without_records(tmp_path):
    r = results.load(synthetic.shared_run("norecords"))
    assert r.records("decode-c8192-n1-r0") is None
    assert r.tokens("decode-c8192-n1-r0").empty
    assert r.requests.empty
    assert r.bins("decode-c8192-n1-r0").size == 0


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        results.load(tmp_path / "absent")
    src = synthetic.shared_run("full")
    shutil.copy(src / "run.json", tmp_path / "run.json")
    d = json.loads((tmp_path / "run.json").read_text())
    del d["cells"][3]["measured_s"]
    (tmp_path / "run.json").write_text(json.dumps(d))
    with pytest.raises(RunFileError, match="measured_s"):
        results.load(tmp_path)
    assert len(results.load(tmp_path, strict=False).cells) == len(d["cells"])


def test_cell_with_repetitions_uses_the_median(tmp_path):
    synthetic.build_run(
        tmp_path, contexts=(8192,), concurrency=(1, 2), prefill_contexts=(8192,), duration_s=2.0
    )
    d = json.loads((tmp_path / "run.json").read_text())
    extra = dict(d["cells"][1], id="decode-c8192-n1-r1", repetition=1, total_tok_s=1000.0)
    extra2 = dict(d["cells"][1], id="decode-c8192-n1-r2", repetition=2, total_tok_s=2000.0)
    d["cells"] += [extra, extra2]
    (tmp_path / "run.json").write_text(json.dumps(d))
    r = results.load(tmp_path)
    assert r.matrix("total_tok_s").loc["8K", 1] == 1000.0
    assert isinstance(r.cells, pd.DataFrame) and len(r.cells) == 5


def test_detect_hardware_from_nvidia_smi():
    out = "NVIDIA H200 NVL, 143771 MiB\n"
    hw = detect_hardware(True, runner=lambda cmd: out)
    # the seed's "141 GB" for the MiB nvidia-smi prints on an H200 NVL
    assert hw["gpu"] == "H200 NVL" and hw["type"] == "Discrete GPU" and hw["vram_gb"] == 141
    assert hw["os"] and hw["gpu_count"] == 1
    assert hw["sources"] == {
        k: "detected" for k in ("type", "gpu", "vram_gb", "os", "cpu", "gpu_count")
    }
    two = detect_hardware(True, runner=lambda cmd: out * 2)
    assert two["gpu"] == "2× H200 NVL" and two["gpu_count"] == 2 and two["vram_gb"] == 282


@pytest.mark.parametrize(
    "mib, sold_as",
    [
        (143771, 141),  # H200 NVL / H200 SXM: "141 GB"
        (81559, 80),  # H100 80GB
        (95830, 94),  # H100 NVL: "94 GB"
        (183359, 180),  # B200: "180 GB"
        (40960, 40),  # A100 40GB: exactly 40 GiB stays 40
        (24564, 24),  # RTX 4090
    ],
)
def test_vram_is_the_gib_figure_rounded_up(mib, sold_as):
    assert vram_gb_from_mib(mib) == sold_as
    hw = detect_hardware(True, runner=lambda cmd: f"NVIDIA X, {mib} MiB\n")
    assert hw["vram_gb"] == sold_as


def test_simulated_engine_is_not_given_this_machines_gpu():
    def smi(cmd):  # a GPU in the machine running the built-in engine
        return "NVIDIA H200 NVL, 143771 MiB\n"

    hw = detect_hardware(True, runner=smi, simulated=True)
    assert hw["type"] == "Simulated" and hw["gpu"] is None and hw["vram_gb"] is None
    assert hw["os"] and hw["sources"]["type"] == "detected"


def test_detect_hardware_absent_failed_and_given():
    def boom(cmd):
        raise OSError("nvidia-smi: not found")

    assert query_gpus(boom) == []
    assert query_gpus(lambda cmd: "garbage\n") == []
    hw = detect_hardware(True, runner=boom)
    assert hw["gpu"] is None and hw["type"] == "CPU"
    remote = detect_hardware(False, given={"gpu": "H200 NVL", "vram": "141 GB", "os": None})
    assert remote["gpu"] == "H200 NVL" and remote["vram_gb"] == 141 and remote["os"] is None
    assert remote["sources"] == {"gpu": "given", "vram_gb": "given"}
    over = detect_hardware(True, given={"gpu": "B200"}, runner=lambda c: "NVIDIA H100, 81559 MiB")
    assert over["gpu"] == "B200" and over["vram_gb"] == 80
    assert over["sources"]["gpu"] == "given" and over["sources"]["vram_gb"] == "detected"
    assert parse_gb("24576 MiB") == 24 and parse_gb("80GiB") == 80 and parse_gb("big") is None


def test_unreadable_records_warn_and_are_skipped(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(synthetic.shared_run("full"), d)
    (d / "records" / "decode-c8192-n1-r0.npz").write_bytes(b"not a zip file")
    r = results.load(d)
    with pytest.warns(UserWarning, match="unreadable"):
        assert r.records("decode-c8192-n1-r0") is None
    assert r.tokens("decode-c8192-n2-r0").shape[0] > 0


def _tiny_records():
    """Two window requests by hand (times in ms): request 0 reads one token at 0, one
    at 10 and two in one socket read at 30 (two events, same stamp); request 1 reads one
    at 5 and three at 25; a warm-up request reads one at -50."""
    from speedmatrix.records import Records

    ms = 1_000_000
    req = {
        "sent_ns": np.array([-100, -10, -10]) * ms,
        "first_token_ns": np.array([-50, 0, 5]) * ms,
        "done_ns": np.array([-49, 31, 26]) * ms,
        "outcome": np.array([1, 1, 1], np.uint8),
        "phase": np.array([0, 1, 1], np.uint8),
        "prompt_tokens": np.array([8, 8, 8]),
    }
    ev = {
        "request": np.array([0, 1, 2, 1, 2, 1, 1], np.int32),
        "t_ns": np.array([-50, 0, 5, 10, 25, 30, 30]) * ms,
        "tokens": np.array([1, 1, 1, 1, 3, 1, 1], np.int32),
    }
    return Records(req, ev), ms


def test_arrivals_merge_one_read_and_spread_its_gap_by_hand():
    rec, ms = _tiny_records()
    a = rec.arrivals()
    assert a["request"].tolist() == [1, 1, 1, 2, 2]
    assert (a["t_ns"] // ms).tolist() == [0, 10, 30, 5, 25]
    assert a["tokens"].tolist() == [1, 1, 2, 1, 3]
    gaps = a["gap_ms"]
    assert np.isnan(gaps[0]) and np.isnan(gaps[3])
    assert gaps[[1, 2, 4]] == pytest.approx([10.0, 10.0, 20.0 / 3])
    # the warm-up request's arrival is there only when asked for
    assert rec.arrivals(phase=-1)["request"].tolist()[0] == 0
    # per-token gaps: the read of two tokens gives two gaps of 10 ms, not 20 and 0
    samples = np.sort(rec.tbt_samples(0, 40 * ms))
    assert samples == pytest.approx([20 / 3] * 3 + [10.0] * 3)
    # ... and they are the multiset whose median the figures report
    fig = _core_figures(rec, 0, 40 * ms)
    assert fig["tbt_ms"] == pytest.approx(np.median(samples))
    assert fig["output_tokens"] == 8


def test_bins_by_hand():
    rec, ms = _tiny_records()
    # 40 ms in 20 ms bins: tokens at 0, 5, 10 (3) and 25, 30 (5)
    assert rec.bins(0, 40 * ms, 0.02) == pytest.approx([3 / 0.02, 5 / 0.02])
    # a remainder shorter than a bin widens the last: 50 ms in 20 ms bins = 20 + 30
    assert rec.bins(0, 50 * ms, 0.02) == pytest.approx([3 / 0.02, 5 / 0.03])


def _core_figures(rec, t0, t1):
    from speedmatrix._native import _core

    return _core.summarize_cell(rec.requests, rec.events, t0, t1, 1.0)
