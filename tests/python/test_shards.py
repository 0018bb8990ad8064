"""Scale-out on Ray, the pure parts (`speedmatrix.shards`): clock offsets from pings,
closed-loop dealing, the pooling of shards' records (exact: every figure of the pooled
cell is the one derivation over the pooled records), and what makes a sharded cell an
error. Table tests on synthetic records; Ray itself only where marked `ray`."""

from __future__ import annotations

import time

import numpy as np
import pytest
from cliproc import run_cli
from speedmatrix._native import _core
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.shards import Dealt, Ping, ShardPart, deal, deal_closed, offset_of, pool_records
from speedmatrix.shards.clock import ClockOffset
from speedmatrix.shards.deal import build_spec, shards_for, spec_fields
from speedmatrix.shards.driver import refuse_unsharded
from speedmatrix.shards.merge import failed, start_problem, window_problem

MS = 1_000_000


# ---- clock offsets -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pings", "same", "offset", "bound", "rtt"),
    [
        # the fastest round trip decides: shard read 1_000_500 at the midpoint 500
        ([Ping(0, 1_000_500, 1000), Ping(0, 1_004_000, 9000)], False, 1_000_000, 500, 1000),
        # a slow ping's midpoint would be off by its half round trip
        ([Ping(100, 2_000_400, 900), Ping(0, 2_010_000, 20_000)], False, 1_999_900, 400, 800),
        # a negative offset (the shard's clock behind)
        ([Ping(10_000, 5_000, 10_010)], False, -5_005, 5, 10),
        # one kernel: one CLOCK_MONOTONIC, whatever the pings say
        ([Ping(0, 777, 1000)], True, 0, 0, 1000),
        # a ping that came back before it was sent is ignored
        ([Ping(10, 0, 5), Ping(0, 60, 100)], False, 10, 50, 100),
    ],
)
def test_offset_is_the_fastest_round_trip(pings, same, offset, bound, rtt):
    got = offset_of(pings, same_host=same)
    assert (got.offset_ns, got.bound_ns, got.rtt_ns, got.same_host) == (offset, bound, rtt, same)
    assert got.to_driver(got.to_shard(12345)) == 12345


def test_offset_needs_a_valid_ping():
    with pytest.raises(ValueError, match="no valid ping"):
        offset_of([Ping(10, 0, 5)])


# ---- dealing -----------------------------------------------------------------------------
def _fields(**kw) -> dict:
    spec = _core.CellSpec()
    spec.url = "http://127.0.0.1:9/v1/completions"
    spec.bodies = [f"b{i}".encode() for i in range(3)]
    spec.warmup_bodies = [f"w{i}".encode() for i in range(5)]
    spec.concurrency = 7
    spec.precision = 0.02
    spec.metrics_url = "http://127.0.0.1:9/metrics"
    for k, v in kw.items():
        setattr(spec, k, v)
    return spec_fields(spec)


def test_dealing_gives_each_global_slot_its_body_once():
    f = _fields()
    parts = deal_closed(f, 3)
    assert [p["concurrency"] for _d, p in parts] == [3, 2, 2]
    got = {}
    for d, p in parts:
        for j, body in enumerate(p["bodies"]):
            got[d.index + j * d.of] = body  # local slot j is global slot i + jK
        assert p["precision"] == 0.0 and p["metrics_url"] == ""
        assert d.bodies == 3
    assert got == {k: f"b{k % 3}".encode() for k in range(7)}
    warm = sorted(b for _d, p in parts for b in p["warmup_bodies"])
    assert warm == sorted(f["warmup_bodies"])  # every warm-up body sent once


@pytest.mark.parametrize(
    ("concurrency", "budget", "asked", "expect"),
    [(7, 0, 3, 3), (1, 0, 4, 1), (2, 0, 5, 2), (8, 3, 4, 3), (8, 8, 2, 2)],
)
def test_a_cell_runs_on_no_more_shards_than_it_has_slots(concurrency, budget, asked, expect):
    f = _fields(concurrency=concurrency, max_requests=budget)
    assert shards_for(f, asked) == expect
    parts = deal_closed(f, asked)
    assert len(parts) == expect
    assert sum(p["concurrency"] for _d, p in parts) == concurrency
    if budget:
        assert sum(p["max_requests"] for _d, p in parts) == budget


def test_an_open_loop_deals_its_one_schedule_round_robin():
    f = _fields(mode="open", rate_per_s=50.0, arrival="poisson", seed=7, duration_s=2.0)
    times = list(_core.arrival_offsets_ns("poisson", 50.0, 1.0, 7, 2.0))
    assert len(times) > 50 and times == sorted(times)
    parts = deal(f, 3)
    assert len(parts) == 3
    got = {}
    for d, p in parts:
        assert p["mode"] == "open" and p["precision"] == 0.0 and p["metrics_url"] == ""
        for j, t in enumerate(p["schedule_ns"]):
            # local arrival j is global arrival i + jK, at its global time, with its body
            got[d.index + j * d.of] = t
            assert p["bodies"][j % len(p["bodies"])] == f"b{(d.index + j * d.of) % 3}".encode()
    assert [got[k] for k in range(len(times))] == times


@pytest.mark.parametrize(("rate", "shards", "expect"), [(0.0001, 3, 1), (5.0, 3, 3), (2.0, 8, 8)])
def test_an_open_loop_has_no_shard_without_an_arrival(rate, shards, expect):
    f = _fields(mode="open", rate_per_s=rate, arrival="constant", duration_s=4.0)
    parts = deal(f, shards)
    assert len(parts) == min(
        expect, max(1, len(_core.arrival_offsets_ns("constant", rate, 1.0, 0, 4.0)))
    )
    assert all(p["schedule_ns"] or len(parts) == 1 for _d, p in parts)


def test_a_gated_open_loop_is_not_dealt():
    f = _fields(mode="open", rate_per_s=5.0, max_concurrency=4)
    with pytest.raises(ValueError, match="max-concurrency"):
        deal(f, 2)
    # one shard runs it whole, its own precision stop kept (one window)
    ((d, part),) = deal(f, 1)
    assert (d.index, d.of) == (0, 1) and part["max_concurrency"] == 4
    assert part["precision"] == 0.02 and part["metrics_url"] == ""


def test_spec_fields_round_trip_without_the_key():
    spec = _core.CellSpec()
    spec.api_key = "sk-secret"
    spec.api = _core.ApiKind.chat
    spec.bodies = [b"x"]
    f = spec_fields(spec)
    assert "api_key" not in f and "sk-secret" not in repr(f)
    back = build_spec(f, "sk-secret")
    assert back.api == _core.ApiKind.chat and back.bodies == [b"x"] and back.api_key == "***"


class _Cell:
    def __init__(self, cid, rate=None, cached=None, phase="decode", concurrency=0):
        self.id, self.rate_per_s, self.cached_fraction, self.phase = cid, rate, cached, phase
        self.trace, self.concurrency = "", concurrency


@pytest.mark.parametrize(
    ("cell", "shards", "refused"),
    [
        (_Cell("decode-a"), 2, None),
        (_Cell("rate-a", rate=5.0), 2, None),  # one schedule, dealt round-robin
        (_Cell("rate-g", rate=5.0, concurrency=4), 2, "max-concurrency"),
        (_Cell("rate-g", rate=5.0, concurrency=4), 1, None),  # one shard: the whole load
        (_Cell("cached-a", cached=0.5), 3, "traffic"),
        # a traffic cell runs in the driver's process: refused with any --ray
        (_Cell("sess", phase="session"), 1, "traffic"),
    ],
)
def test_cells_not_dealt_are_refused_with_ray(cell, shards, refused):
    if refused is None:
        refuse_unsharded([cell], shards)
        return
    with pytest.raises(SpeedmatrixError, match=refused) as err:
        refuse_unsharded([cell], shards)
    assert "\n" not in str(err.value) and cell.id in str(err.value)


# ---- pooling -----------------------------------------------------------------------------
def _shard(index: int, of: int, offset_ns: int, t0: int, t1: int, gap_ms: float) -> ShardPart:
    """A shard of 2 local slots (on its own clock: driver time + offset), each streaming a
    token every ``gap_ms`` from t0 - 100 ms to t1 + 50 ms, plus one warm-up request."""
    rows, ev_req, ev_t = [], [], []
    rows.append((0, 0, 0, t0 - 500 * MS, t0 - 400 * MS))  # slot, body, phase, sent, done
    for s in range(2):
        rows.append((s, s, 1, t0 - 200 * MS, t1 + 60 * MS))
        t = t0 - 100 * MS + s * MS
        while t <= t1 + 50 * MS:
            ev_req.append(len(rows) - 1)
            ev_t.append(t)
            t += int(gap_ms * MS)
    n = len(rows)

    def col(k: int) -> np.ndarray:
        return np.array([r[k] for r in rows], np.int64)

    sent, done = col(3) + offset_ns, col(4) + offset_ns
    first = np.array([sent[i] + 100 * MS for i in range(n)], np.int64)
    req = {
        "slot": col(0).astype(np.int32),
        "body": col(1).astype(np.int32),
        "phase": col(2).astype(np.uint8),
        "scheduled_ns": sent,
        "sent_ns": sent,
        "first_byte_ns": first,
        "first_token_ns": first,
        "first_content_ns": first,
        "done_ns": done,
        "outcome": np.full(n, 2, np.uint8),
        "output_tokens": np.zeros(n, np.int64),
        "prompt_tokens": np.full(n, 10, np.int64),
        "token_source": np.ones(n, np.uint8),
        "error_kind": [""] * n,
    }
    order = np.argsort(ev_t, kind="stable")
    ev = {
        "request": np.array(ev_req, np.int32)[order],
        "t_ns": np.array(ev_t, np.int64)[order] + offset_ns,
        "tokens": np.ones(len(ev_t), np.int32),
        "server_ns": np.full(len(ev_t), -1, np.int64),
    }
    stamps = {
        "ramp_start_ns": t0 - 200 * MS + offset_ns,
        "window_start_ns": t0 + offset_ns,
        "window_end_ns": t1 + offset_ns,
        "warmup_start_ns": t0 - 500 * MS + offset_ns,
        "end_ns": t1 + 70 * MS + offset_ns,
        "stalls": index + 1,
        "client_cpu_s": 0.5,
        "client_threads": 1 + index,
        "stopped_by": "duration",
    }
    off = ClockOffset(offset_ns, 0, 0)
    return ShardPart(Dealt(index, of, 3), off, req, ev, stamps, t0 - MS + offset_ns, t0 - MS)


def _figures(rec, t0, t1):
    return _core.summarize_cell(rec.requests, rec.events, t0, t1, 1.0, -1, rec.ramp_start_ns)


def test_pooled_records_are_the_shards_on_one_clock():
    t0 = 10_000 * MS
    a = _shard(0, 2, 0, t0, t0 + 2000 * MS, 10.0)
    b = _shard(1, 2, 7_000_000_000, t0 + 30 * MS, t0 + 2030 * MS, 25.0)  # its clock 7 s ahead
    rec = pool_records([a, b])
    # the window every shard covers, on the driver's clock
    assert (rec.window_start_ns, rec.window_end_ns) == (t0 + 30 * MS, t0 + 2000 * MS)
    assert rec.shards == 2 and rec.stalls == 3 and rec.client_cpu_s == 1.0
    assert rec.client_threads == 2 and rec.warmup_start_ns == t0 - 500 * MS
    # requests by (phase, send time, shard), slots and bodies numbered globally
    assert rec.requests["phase"].tolist() == [0, 0, 1, 1, 1, 1]
    window = rec.requests["phase"] == 1
    assert sorted(rec.requests["slot"][window].tolist()) == [0, 1, 2, 3]
    assert np.array_equal(rec.requests["body"][window], rec.requests["slot"][window] % 3)
    assert rec.requests["error_kind"] == [""] * 6
    # events in time order, each still pointing at its own request
    assert np.all(np.diff(rec.events["t_ns"]) >= 0)
    assert len(rec.events["t_ns"]) == len(a.events["t_ns"]) + len(b.events["t_ns"])
    sent_of = rec.requests["sent_ns"][rec.events["request"]]
    assert np.all(rec.events["t_ns"] - sent_of == pytest.approx(100 * MS, abs=3000 * MS))
    assert np.all(rec.events["t_ns"] >= sent_of)


def test_pooled_totals_are_the_sum_and_percentiles_the_pooled_records():
    t0 = 10_000 * MS
    a = _shard(0, 2, 0, t0, t0 + 2000 * MS, 10.0)
    b = _shard(1, 2, -3_000_000, t0, t0 + 2000 * MS, 25.0)
    rec = pool_records([a, b])
    t0p, t1p = rec.window_start_ns, rec.window_end_ns
    whole = _figures(rec, t0p, t1p)
    each = [_figures(pool_records([p]), t0p, t1p) for p in (a, b)]
    # counts are summed (each shard judged over the pooled window)
    assert whole["output_tokens"] == sum(f["output_tokens"] for f in each)
    assert whole["total_tok_s"] == pytest.approx(sum(f["total_tok_s"] for f in each), rel=1e-12)
    # the pooled median gap lies between the shards' (10 and 25 ms), and is the pooled
    # sample's, never an average of the shards' medians
    gaps = np.concatenate(
        [np.diff(rec.events["t_ns"][rec.events["request"] == r]) for r in (2, 3, 4, 5)]
    )
    assert whole["tbt_ms"] == pytest.approx(np.median(gaps) / MS, rel=1e-9)
    assert whole["tbt_ms"] != pytest.approx((each[0]["tbt_ms"] + each[1]["tbt_ms"]) / 2)


def test_a_request_bound_window_spans_every_shard():
    t0 = 10_000 * MS
    a = _shard(0, 2, 0, t0, t0 + 1000 * MS, 10.0)
    b = _shard(1, 2, 0, t0 + 10 * MS, t0 + 1500 * MS, 10.0)
    rec = pool_records([a, b], request_bound=True)
    assert (rec.window_start_ns, rec.window_end_ns) == (t0, t0 + 1500 * MS)


@pytest.mark.parametrize(
    ("started_late_ms", "problem"),
    [(0, None), (99, None), (150, "shard 1 started 150 ms after")],
)
def test_a_shard_that_starts_late_is_said(started_late_ms, problem):
    t0 = 10_000 * MS
    a = _shard(0, 2, 0, t0, t0 + 2000 * MS, 10.0)
    b = _shard(1, 2, 5 * MS, t0, t0 + 2000 * MS, 10.0)
    b.started_ns = b.start_at_ns + started_late_ms * MS
    got = start_problem([a, b], 100 * MS)
    assert (got is None) if problem is None else (problem in got)


@pytest.mark.parametrize(("skew_ms", "bad"), [(100, False), (900, False), (1100, True)])
def test_windows_that_barely_overlap_are_an_error(skew_ms, bad):
    t0 = 10_000 * MS
    a = _shard(0, 2, 0, t0, t0 + 2000 * MS, 10.0)
    b = _shard(1, 2, 0, t0 + skew_ms * MS, t0 + skew_ms * MS + 2000 * MS, 10.0)
    rec = pool_records([a, b])
    why = window_problem([a, b], rec, 0.5)
    assert (why is not None) == bad
    if bad:
        assert "shard 1" in why and "\n" not in why
        failed(rec, why)
        assert rec.window_start_ns == -1 and rec.fatal_error == why


# ---- Ray: a wrong address, in one line and bounded ------------------------------------
@pytest.mark.ray
def test_a_wrong_ray_address_fails_in_one_line(tmp_path):
    pytest.importorskip("ray")
    start = time.monotonic()
    res = run_cli(
        "run", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "r"),
        "--ray", "127.0.0.1:9", "--shards", "2", timeout=60,
    )  # fmt: skip
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--ray 127.0.0.1:9" in lines[0], res.stderr
    assert time.monotonic() - start < 30


def test_shards_need_ray(tmp_path):
    res = run_cli("run", "--url", "http://127.0.0.1:9", "--out", str(tmp_path), "--shards", "2")
    assert res.returncode == 2 and "--shards needs --ray" in res.stderr
