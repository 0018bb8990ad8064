"""A cell's token events spilled to disk (issue 14, bounded memory per cell: records.hpp
EventColumns) reach Python as the same records as events held in memory, the precision stop
still works over spilled events, and a spill directory that cannot be used keeps the events
in memory with one note. The spill itself is table-tested in tests/cpp/test_records.cpp; here
real (short) cells run through the bindings against the built-in engine on 127.0.0.1.
"""

from __future__ import annotations

import gc
import os
import tempfile

import numpy as np
import pytest
from speedmatrix._native import _core
from speedmatrix.records import Records
from speedmatrix.sim import Sim

BODY = b'{"model":"sim-test","prompt":"a b c","max_tokens":60,"stream":true}'


def _spec(url: str, **kw):
    spec = _core.CellSpec()
    spec.url = url
    spec.bodies = [BODY]
    spec.concurrency = 6
    spec.duration_s = 20.0
    spec.max_requests = 12
    spec.steady_window = False
    for k, v in kw.items():
        setattr(spec, k, v)
    return spec


def _per_request(res):
    """(events, tokens) per request, from the event columns; checks they are consistent with
    the request columns on the way."""
    req, ev = res.requests, res.events
    n = len(req["outcome"])
    for k in ("request", "t_ns", "tokens", "server_ns"):
        assert len(ev[k]) == len(ev["t_ns"])
    q = np.asarray(ev["request"])
    t = np.asarray(ev["t_ns"])
    assert np.all(np.diff(t) >= 0)  # arrival order
    counts = np.bincount(q, minlength=n)
    tokens = np.bincount(q, weights=np.asarray(ev["tokens"]), minlength=n).astype(np.int64)
    for i in range(n):
        if counts[i]:
            mine = t[q == i]
            assert mine[0] == req["first_token_ns"][i]
            assert mine[-1] <= req["done_ns"][i]
    return counts, tokens


def _spill_mappings() -> int:
    """Mappings of deleted files in the temporary directory: the spill files' columns."""
    tmp = os.path.realpath(os.environ.get("TMPDIR") or tempfile.gettempdir())
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith("(deleted)") and f" {tmp}/" in line)


def test_spill_threshold_is_a_cell_spec_field_with_a_sane_default():
    spec = _core.CellSpec()
    assert spec.spill_events >= 100_000  # a short cell never touches the disk
    assert spec.spill_dir == ""
    spec.spill_events = 7
    assert spec.spill_events == 7
    assert 1_000 <= spec.spill_requests <= 100_000  # ~0.2-20 MB of request records
    spec.spill_requests = 9
    assert spec.spill_requests == 9


@pytest.mark.e2e
def test_a_spilled_cell_gives_the_same_records_as_one_in_memory():
    with Sim("test-fast") as sim:
        url = sim.url + "/v1/completions"
        kept = _core.CellRunner(_spec(url, spill_events=0)).run()
        spilled = _core.CellRunner(_spec(url, spill_events=50)).run()
    for res in (kept, spilled):
        assert res.fatal_error == ""
        assert res.events_note == ""
        assert list(res.requests["outcome"]).count(1) == 12  # every request OK
    a_counts, a_tokens = _per_request(kept)
    b_counts, b_tokens = _per_request(spilled)
    # 12 x 60 tokens: far past 50 events, so the second cell spilled ~14 times
    assert len(spilled.events["t_ns"]) == len(kept.events["t_ns"]) > 10 * 50
    assert list(a_counts) == list(b_counts)
    assert list(a_tokens) == list(b_tokens) == list(spilled.requests["output_tokens"])
    assert spilled.events["t_ns"].dtype == np.int64 and spilled.events["tokens"].dtype == np.int32
    assert np.all(np.asarray(spilled.events["server_ns"]) == -1)  # no stamps asked
    # the arrays over the spill files are ordinary arrays: copy, write, save
    t = spilled.events["t_ns"]
    assert int(t.copy().sum()) == int(np.sum(t))
    # the spilled cell's four columns are mappings of the unlinked spill files, unmapped
    # (and the files gone) once the arrays are
    before = _spill_mappings()
    assert before >= 4
    del spilled, res, t
    gc.collect()
    assert _spill_mappings() == before - 4


@pytest.mark.e2e
def test_the_precision_stop_reads_spilled_events():
    with Sim("test-fast") as sim:
        spec = _spec(sim.url + "/v1/completions", spill_events=64, max_requests=0)
        spec.bodies = [BODY.replace(b'"max_tokens":60', b'"max_tokens":100')]
        spec.steady_window = True
        spec.concurrency = 8
        spec.precision = 0.02
        spec.min_duration_s = 3.0
        res = _core.CellRunner(spec).run()
    assert res.stopped_by == "precision"
    assert len(res.events["t_ns"]) > 10 * 64
    f = _core.summarize_cell(
        res.requests,
        res.events,
        int(res.window_start_ns),
        int(res.window_end_ns),
        1.0,
        -1,
        int(res.ramp_start_ns),
    )
    assert f["precision"] <= 0.02
    assert f["total_tok_s"] == pytest.approx(8 * 50.0, rel=0.05)


@pytest.mark.e2e
def test_a_spill_directory_that_cannot_be_used_keeps_the_events_in_memory(tmp_path):
    missing = tmp_path / "not-there"
    with Sim("test-fast") as sim:
        res = _core.CellRunner(
            _spec(sim.url + "/v1/completions", spill_events=50, spill_dir=str(missing))
        ).run()
    assert res.fatal_error == ""
    assert "kept in memory" in res.events_note and str(missing) in res.events_note
    # kept with the cell's records (saved beside the arrays)
    assert Records.from_result(res).stamps()["events_note"] == res.events_note
    _counts, tokens = _per_request(res)
    assert list(tokens) == list(res.requests["output_tokens"])
    assert int(tokens.sum()) == 12 * 60


@pytest.mark.e2e
def test_spilled_request_records_reach_python_whole():
    """Past spill_requests in memory, records finished 2 s ago go to a spill file
    (records.hpp RequestLog); the columns Python gets are every record, spilled or not."""
    body = BODY.replace(b'"max_tokens":60', b'"max_tokens":8')
    with Sim("test-fast") as sim:
        spec = _spec(sim.url + "/v1/completions", spill_requests=16, max_requests=0)
        spec.bodies = [body]
        spec.duration_s = 4.0
        res = _core.CellRunner(spec).run()
        kept_spec = _spec(sim.url + "/v1/completions", spill_requests=0, max_requests=0)
        kept_spec.bodies = [body]
        kept_spec.duration_s = 4.0
        kept = _core.CellRunner(kept_spec).run()
    assert res.fatal_error == "" and res.requests_note == ""
    n = len(res.requests["outcome"])
    assert kept.requests_spilled == 0
    assert res.requests_spilled > n // 4  # what finished before the last 2 s
    for k, col in res.requests.items():
        assert len(col) == n, k
    out = np.asarray(res.requests["outcome"])
    assert set(out.tolist()) <= {1, 2}  # ok, or cut at the window's end
    ok = out == 1
    assert list(np.asarray(res.requests["output_tokens"])[ok]) == [8] * int(ok.sum())
    assert {res.requests["finish_reason"][i] for i in np.flatnonzero(ok)} == {"length"}
    assert np.all(np.diff(np.asarray(res.requests["sent_ns"])) >= 0)  # send order
    _counts, tokens = _per_request(res)
    assert list(tokens) == list(res.requests["output_tokens"])

    # the same figures as a cell that kept its records in memory, within the engine's jitter
    def rate(r):
        return _core.summarize_cell(
            r.requests, r.events, int(r.window_start_ns), int(r.window_end_ns), 1.0, -1, -1
        )["total_tok_s"]

    assert rate(res) == pytest.approx(rate(kept), rel=0.1)
