"""Scale-out on Ray end to end (`speedmatrix.shards`): a local two-node cluster
(`ray.cluster_utils.Cluster`, one CPU each, one for the module: Ray starts slowly on two
cores) and the built-in engine's ``fixed`` profile (every request its own schedule: TTFT,
then one token per ITL, no running cap). The same cells with 1 and 2 shards agree; a
merged run's totals are the sum of its shards' and its percentiles the pooled records';
a killed shard actor fails its cell with the reason."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import speedmatrix as sm
from cliproc import run_cli
from speedmatrix import runfile, schema
from speedmatrix._native import _core
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.recompute import recompute_doc
from speedmatrix.records import Records
from speedmatrix.shards import driver
from speedmatrix.shards import pool as shards_pool
from speedmatrix.shards.pool import ShardPool
from speedmatrix.sim import Sim
from speedmatrix.verdict import CellShape, EngineFacts, Rules, decode_cell

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.e2e, pytest.mark.ray]

ITL_MS = 20.0
BODY = {"prompt": "hello", "max_tokens": 400, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster  # optional: the ray marker's tests only

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def engine():
    with Sim("fixed", overrides={"fixed_itl_ms": ITL_MS}, stamp=True) as sim:
        yield sim


def _spec(url: str, n: int = 8, duration_s: float = 3.0) -> _core.CellSpec:
    spec = _core.CellSpec()
    spec.url = url + "/v1/completions"
    spec.bodies = [json.dumps({**BODY, "prompt": p}).encode() for p in ("a", "b", "c")]
    spec.warmup_bodies = [json.dumps({**BODY, "max_tokens": 1}).encode()] * 4
    spec.concurrency = n
    spec.duration_s = duration_s
    spec.client_threads = 1
    return spec


def _figures(rec: Records) -> dict:
    assert not rec.fatal_error, rec.fatal_error
    t0, t1 = rec.window_start_ns, rec.window_end_ns
    return _core.summarize_cell(rec.requests, rec.events, t0, t1, 1.0, -1, rec.ramp_start_ns)


def test_one_and_two_shards_agree(cluster, engine):
    pool1 = ShardPool(cluster.address, 1)
    try:
        one, i1 = driver.measure(pool1, _spec(engine.url), None)
    finally:
        pool1.close()
    pool = ShardPool(cluster.address, 2)
    try:
        # one shard per node (SPREAD), both under this kernel: one clock, offset 0
        assert len({n["node_id"] for n in pool.nodes}) == 2
        assert len({n["boot_id"] for n in pool.nodes}) == 1 and pool.offset(1).same_host
        two, i2 = driver.measure(pool, _spec(engine.url), None)
    finally:
        pool.close()
    assert not i1 and not i2 and (one.shards, two.shards) == (1, 2)
    f1, f2 = _figures(one), _figures(two)
    for name in ("total_tok_s", "tbt_ms", "ttft_ms", "decode_tok_s_per_request"):
        assert f2[name] == pytest.approx(f1[name], rel=0.02), (name, f1[name], f2[name])
    assert f2["total_tok_s"] == pytest.approx(8 * 1000 / ITL_MS, rel=0.02)
    window = two.requests["phase"] == 1
    assert sorted(set(two.requests["slot"][window].tolist())) == list(range(8))
    assert np.array_equal(two.requests["body"][window], two.requests["slot"][window] % 3)
    assert not np.any(two.requests["outcome"] == 3)


def test_a_merged_run_is_its_shards_pooled(cluster, engine, tmp_path):
    # a standalone prefill cell too: one slot, so one shard runs it whole
    m = sm.Matrix(contexts=[64], concurrency=[6], duration_s=3, max_output=400)
    m.prefill_contexts = [128]
    run = sm.run(engine.url, m, out=tmp_path, progress=False, ray=cluster.address, shards=2)
    cell = next(c for c in run.doc["cells"] if c["phase"] == "decode")
    assert cell["status"] == "valid" and cell["shards"] == 2, cell
    assert run.doc["meta"]["run"]["shards"]["shards"] == 2
    schema.check(runfile.read_run(tmp_path))  # the saved run follows the schema
    assert "Client shards" in (tmp_path / "report.md").read_text()
    # the server's /metrics, sampled once by the driver over the window
    assert cell["server"] and cell["server"]["samples"] > 0, cell["server"]
    prefill = next(c for c in run.doc["cells"] if c["phase"] == "prefill")
    assert prefill["status"] == "valid", prefill
    assert list(run.cells.loc[run.cells["phase"] == "decode", "shards"]) == [2]
    rec = Records.from_saved(tmp_path, cell)
    assert rec.shards == 2
    t0, t1 = cell["t0_ns"], cell["t1_ns"]
    req, ev = rec.requests, rec.events
    # each shard's part: its global slots are i, i + 2, ...
    each = []
    for s in (0, 1):
        keep = (req["slot"] % 2) == s
        ids = np.flatnonzero(keep)
        new = np.full(len(keep), -1)
        new[ids] = np.arange(len(ids))
        evk = np.isin(ev["request"], ids)
        part_req = {
            k: (
                np.asarray(v)[keep]
                if not isinstance(v, list)
                else [x for x, k2 in zip(v, keep) if k2]
            )
            for k, v in req.items()
        }
        part_ev = {k: np.asarray(v)[evk] for k, v in ev.items()}
        part_ev["request"] = new[part_ev["request"]]
        each.append(_core.summarize_cell(part_req, part_ev, t0, t1, 1.0, -1, cell["ramp_start_ns"]))
    # totals are the sum of the shards' (1%: the issue's target; exact here)
    assert cell["output_tokens"] == sum(f["output_tokens"] for f in each)
    assert cell["total_tok_s"] == pytest.approx(sum(f["total_tok_s"] for f in each), rel=0.01)
    # percentiles are the pooled records', through the one derivation (recompute agrees)
    whole = _core.summarize_cell(req, ev, t0, t1, 1.0, -1, cell["ramp_start_ns"], [0.5, 0.99])
    assert cell["tbt_ms"] == pytest.approx(whole["tbt_ms"], rel=1e-12)
    assert cell["ttft_p99_ms"] == pytest.approx(whole["ttft_p99_ms"], rel=1e-12)
    # every figure of the merged run recomputes from its saved (pooled) records
    assert recompute_doc(runfile.read_run(tmp_path), tmp_path).changed == []


def test_a_killed_shard_fails_its_cell_with_the_reason(cluster, engine):
    pool = ShardPool(cluster.address, 2)
    try:
        box = {}
        t = threading.Thread(
            target=lambda: box.update(
                out=driver.measure(
                    pool, _spec(engine.url, duration_s=6), None, live=lambda r: box.update(live=r)
                )
            )
        )
        start = time.monotonic()
        t.start()
        time.sleep(2.5)
        # the live view's figures: both shards' counters, their window open
        now = box["live"].progress()
        assert now["tokens"] > 0 and now["window_start_ns"] > 0 and now["in_flight"] == 8, now
        ray.kill(pool.actors[1])
        t.join(60)
        assert not t.is_alive(), "the cell ended once a shard died"
        rec, interrupted = box["out"]
    finally:
        pool.close()
    assert not interrupted
    assert "shard 1" in rec.fatal_error and "\n" not in rec.fatal_error, rec.fatal_error
    assert rec.window_start_ns == -1 and time.monotonic() - start < 30
    # the verdict makes it an error with that reason (never a smaller valid load)
    shape = CellShape("decode-x", "decode", 1, "1", 8)
    out = decode_cell(shape, rec, EngineFacts(), Rules(), idle=True)
    assert out["status"] == "error" and "shard 1" in out["reason"]


def test_a_late_shard_fails_its_cell_and_sends_no_load(cluster, engine, monkeypatch):
    # a common start already past when the shards get it: every shard is late
    monkeypatch.setattr(driver, "start_lead_ns", lambda offsets: -2_000_000_000)
    pool = ShardPool(cluster.address, 2)
    try:
        rec, interrupted = driver.measure(pool, _spec(engine.url), None)
    finally:
        pool.close()
    assert not interrupted and rec.window_start_ns == -1
    assert "after the common start time" in rec.fatal_error, rec.fatal_error
    assert len(rec.requests["sent_ns"]) == 0  # no shard sent anything


def test_an_open_loop_is_one_schedule_dealt_over_the_shards(cluster, engine):
    def spec():
        s = _spec(engine.url, n=1, duration_s=3.0)
        s.bodies = [json.dumps({**BODY, "max_tokens": 20, "prompt": p}).encode() for p in "abc"]
        s.warmup_bodies = []
        s.mode, s.rate_per_s, s.arrival, s.seed = "open", 40.0, "poisson", 11
        s.drain_timeout_s = 5.0
        return s

    due = _core.arrival_offsets_ns("poisson", 40.0, 1.0, 11, 3.0)
    got = {}
    for k in (1, 2):
        pool = ShardPool(cluster.address, k)
        try:
            got[k], _ = driver.measure(pool, spec(), None)
        finally:
            pool.close()
    for k, rec in got.items():
        assert not rec.fatal_error and rec.shards == k, rec.fatal_error
        window = rec.requests["phase"] == 1
        # every arrival of the one schedule sent once, by arrival index, with its body
        assert sorted(rec.requests["slot"][window].tolist()) == list(range(len(due)))
        assert np.array_equal(rec.requests["body"][window], rec.requests["slot"][window] % 3)
        # each at its global time from the cell's start (within the shards' start skew)
        sched = rec.requests["scheduled_ns"][window] - rec.requests["scheduled_ns"][window].min()
        order = np.argsort(rec.requests["slot"][window])
        assert np.allclose(sched[order], np.asarray(due) - due[0], atol=5e6)
    f1, f2 = _figures(got[1]), _figures(got[2])
    assert f2["ttft_ms"] == pytest.approx(f1["ttft_ms"], rel=0.1)
    assert f2["output_tokens"] == pytest.approx(f1["output_tokens"], rel=0.02)


def test_the_cli_runs_on_shards(cluster, engine, tmp_path):
    res = run_cli(
        "run", "--url", engine.url, "--out", str(tmp_path / "r"), "--ray", cluster.address,
        "--shards", "2", "--contexts", "64", "--concurrency", "4", "--duration", "2s",
        "--max-output", "400", "--prefill-contexts", "none", "--no-report", "--quiet",
        timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    cells = runfile.read_run(tmp_path / "r")["cells"]
    assert [(c["status"], c["shards"]) for c in cells] == [("valid", 2)]


def test_a_dead_shard_fails_the_next_cell_at_once(cluster, engine):
    pool = ShardPool(cluster.address, 2)
    try:
        ray.kill(pool.actors[1])
        start = time.monotonic()
        rec, interrupted = driver.measure(pool, _spec(engine.url), None)
    finally:
        pool.close()
    assert not interrupted and rec.window_start_ns == -1 and rec.shards == 2
    assert "shard 1's clock could not be read" in rec.fatal_error and time.monotonic() - start < 30
    out = decode_cell(
        CellShape("decode-x", "decode", 1, "1", 8), rec, EngineFacts(), Rules(), idle=True
    )
    assert out["status"] == "error" and "clock" in out["reason"]


def test_more_shards_than_the_cluster_holds_is_one_line(cluster, monkeypatch):
    monkeypatch.setattr(shards_pool, "PLACE_TIMEOUT_S", 3.0)
    with pytest.raises(SpeedmatrixError, match="no room for 3 shard") as err:
        ShardPool(cluster.address, 3)  # two one-CPU nodes
    assert "\n" not in str(err.value) and "its CPUs: 2" in str(err.value)
    ShardPool(cluster.address, 2).close()  # the failed group was given back


def test_a_shard_past_its_bound_is_stopped_and_fails_the_cell(cluster, engine, monkeypatch):
    monkeypatch.setattr(driver, "cell_bound_s", lambda fields: 2.0)
    pool = ShardPool(cluster.address, 2)
    try:
        start = time.monotonic()
        rec, interrupted = driver.measure(pool, _spec(engine.url, duration_s=20), None)
    finally:
        pool.close()
    assert not interrupted and "did not end the cell in 2 s" in rec.fatal_error
    assert time.monotonic() - start < 15  # stopped, not waited for the 20 s window
    assert len(rec.requests["sent_ns"]) > 0  # the stopped shards' records came back
