"""The twin's fit from raw records (`speedmatrix fit`, `sm.fit`) and its predicted run folder
(`speedmatrix predict --out`, `sm.predict`), on synthetic records of a known profile."""

from __future__ import annotations

import json

import numpy as np
import pytest
import speedmatrix as sm
from speedmatrix.cli import main
from speedmatrix.records import Records
from speedmatrix.sim import Sim, load_profile
from speedmatrix.twin.model import STEP_KEYS, cold_ttft_ms, step_ms
from speedmatrix.twin.samples import prefill_samples, step_sample
from twin_synthetic import engine_records, write_engine_run

TRUTH = load_profile("seed-h200")
#: corners, the knee and a queued cell (N > max running) of a seed-shaped matrix
FIT_CELLS = [(8192, 1), (8192, 64), (65536, 1), (65536, 16), (125952, 8), (16384, 32)]


def _records(context: int, n: int, **kw) -> tuple[dict, Records]:
    req, ev, t0, t1 = engine_records(TRUTH, context, n, **kw)
    cell = {"id": f"decode-c{context}-n{n}-r0", "context": context, "concurrency": n}
    return cell, Records(req, ev, window_start_ns=t0, window_end_ns=t1)


@pytest.mark.parametrize("context, n", [(8192, 1), (32768, 16), (8192, 64)])
def test_a_step_sample_reads_the_batch_kv_and_step_the_engine_ran(context, n) -> None:
    cell, rec = _records(context, n)
    s = step_sample(cell, rec)
    assert s is not None
    assert s.batch == pytest.approx(n, rel=0.01)
    generated = rec.requests["output_tokens"][1:].mean() / 2  # the window's mean, roughly
    assert s.kv_tokens == pytest.approx(n * (context + generated), rel=0.05)
    assert s.tbt_ms == pytest.approx(step_ms(TRUTH, n, s.kv_tokens), rel=0.01)
    assert s.mean_step_ms == pytest.approx(s.tbt_ms, rel=0.01)


def test_a_queued_cell_decodes_max_running_at_a_time() -> None:
    profile = {**TRUTH, "max_running": 8}
    req, ev, t0, t1 = engine_records(profile, 8192, 20)
    s = step_sample(
        {"id": "q", "context": 8192, "concurrency": 20},
        Records(req, ev, window_start_ns=t0, window_end_ns=t1),
    )
    assert s is not None and s.batch == pytest.approx(8, rel=0.01)


def test_cold_prefills_are_the_alone_warmups_and_cache_hits_are_left_out() -> None:
    cells = [_records(c, 4, t_start=(i + 1) * 10**13) for i, c in enumerate((8192, 16384))]
    hit_cell, hit = _records(8192, 4, t_start=9 * 10**13)
    hit.requests["first_token_ns"][0] = hit.requests["sent_ns"][0] + 80_000_000  # 80 ms: cached
    samples = prefill_samples([*cells, (hit_cell, hit)])
    assert [s.prompt_tokens for s in samples] == [8192, 16384]
    for s in samples:
        assert s.ttft_ms == pytest.approx(cold_ttft_ms(TRUTH, s.prompt_tokens), rel=1e-3)
    # a warm-up that overlapped another request is not a cold prefill
    req = hit.requests
    req["sent_ns"][1] = req["sent_ns"][0] + 1
    assert prefill_samples([(hit_cell, hit)]) == []


def test_fit_from_records_recovers_the_engine_profile(tmp_path) -> None:
    run_dir = write_engine_run(tmp_path / "run", TRUTH, [*FIT_CELLS, (8192, 128)], noise=0.01)
    profile = sm.fit(run_dir)
    fit = profile["fit"]
    assert "decode-c8192-n128-r0" not in fit["cells"]  # over capacity: nothing measured
    assert len(fit["cells"]) == len(FIT_CELLS)
    for key in ("step_base_ms", "step_per_kv_token_ns"):
        assert profile[key] == pytest.approx(TRUTH[key], rel=0.05), key
        assert 0 < fit["sd"][key] < 0.05 * TRUTH[key], key
    assert max(abs(r) for r in fit["residuals"]["tbt_ms"].values()) < 0.02
    ttft = cold_ttft_ms(profile, 32768)
    assert ttft == pytest.approx(cold_ttft_ms(TRUTH, 32768), rel=0.02)
    for key in ("kv_tokens", "max_running", "context_length", "block_size"):
        assert profile[key] == TRUTH[key]
    # the fitted profile predicts a cell nobody measured within its interval
    run = sm.predict(profile, [32768], [4])
    (cell,) = run.doc["cells"]
    step = step_ms(TRUTH, 4, 4 * (32768 + 500.0 * 2.0 / cell["tbt_ms"]))
    assert cell["tbt_ms_low"] <= step <= cell["tbt_ms_high"]
    assert cell["tbt_ms"] == pytest.approx(step, rel=0.02)


def test_a_slot_bound_server_keeps_its_rule_and_its_slots_stand_for_the_pool(tmp_path) -> None:
    """A run planned with llama.cpp's split slots (no pool stated): the fitted profile's pool
    is the slots' caches together and its statuses follow the slot rule, not a shared pool.
    The cells with slots partly busy (1 < N < slots) are left out of the fit, each with why:
    their step ran in one or more passes by slot gaps the records do not show."""
    run_dir = write_engine_run(tmp_path / "run", TRUTH, FIT_CELLS)
    doc = json.loads((run_dir / "run.json").read_text())
    slot, slots = 65536, 64  # 64 slots: the highest level fills them, lower ones do not
    doc["meta"]["capacity"]["kv_tokens"] = {"value": None, "source": "not stated"}
    doc["meta"]["capacity"]["max_running"] = {"value": slots, "source": "/props total_slots"}
    doc["meta"]["run"]["plan"] = {
        "capacity_model": {"family": "per_slot", "slot_tokens": slot, "slots": slots}
    }
    (run_dir / "run.json").write_text(json.dumps(doc))
    profile = sm.fit(run_dir)
    assert profile["kv_tokens"] == slot * slots
    assert profile["fit"]["capacity"] == {"family": "per_slot", "slot_tokens": slot}
    partly = {f"decode-c{c}-n{n}-r0" for c, n in FIT_CELLS if 1 < n < slots}
    assert set(profile["fit"]["left_out"]) == partly and partly
    assert set(profile["fit"]["cells"]) == {f"decode-c{c}-n{n}-r0" for c, n in FIT_CELLS} - partly
    over, fits = sm.predict(profile, [slot - 100, slot - 300], [1], max_output=200).doc["cells"]
    assert over["status"] == "over_capacity" and fits["status"] == "valid"


def test_too_few_measured_cells_is_one_clear_line(tmp_path, capsys) -> None:
    run_dir = write_engine_run(tmp_path / "run", TRUTH, [(8192, 1), (8192, 4)])
    assert main(["fit", str(run_dir), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "3 valid cells" in err[0]
    assert not (tmp_path / "p.json").exists()
    assert main(["fit", str(tmp_path), "-o", str(tmp_path / "p.json")]) == 2
    assert "holds no run.json" in capsys.readouterr().err


def test_the_fitted_profile_loads_in_sim_and_predict_writes_a_predicted_run(
    tmp_path, capsys
) -> None:
    run_dir = write_engine_run(tmp_path / "run", TRUTH, FIT_CELLS)
    out = tmp_path / "fitted.json"
    assert main(["fit", str(run_dir), "-o", str(out)]) == 0
    assert "step_base_ms" in capsys.readouterr().out
    profile = json.loads(out.read_text())
    with Sim(out) as engine:
        assert engine.state()["profile"]["step_base_ms"] == pytest.approx(profile["step_base_ms"])
    pred = tmp_path / "pred"
    argv = [
        "predict",
        str(out),
        "--contexts",
        "8K,max",
        "--concurrency",
        "1,64",
        "--out",
        str(pred),
    ]
    assert main(argv) == 0
    assert "(predicted)" in capsys.readouterr().out
    run = sm.load(pred)
    cells = run.cells.set_index("id")
    assert cells["predicted"].all()
    assert cells.loc["decode-c125952-n64-r0", "status"] == "over_capacity"
    valid = cells[cells["status"] == "valid"]
    assert len(valid) == 3
    assert (valid["total_tok_s_low"] < valid["total_tok_s"]).all()
    assert (valid["total_tok_s"] < valid["total_tok_s_high"]).all()
    assert np.isfinite(valid["tbt_ms"]).all()
    assert run.meta["run"]["prediction"]["fitted_cells"] == profile["fit"]["cells"]
    for key in STEP_KEYS:
        assert key in profile["fit"]["sd"]
