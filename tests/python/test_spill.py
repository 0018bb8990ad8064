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
    # the columns issue 23 added cross spilled and kept alike: /v1/completions has no
    # reasoning channel, so the first content is the first token, and no reasoning streamed
    for r in (res, kept):
        first = np.asarray(r.requests["first_token_ns"])
        assert np.array_equal(np.asarray(r.requests["first_content_ns"]), first)
        assert not np.asarray(r.requests["reasoning_deltas"]).any()
        assert np.asarray(r.requests["reasoning_tokens"]).dtype == np.int64
        assert np.asarray(r.requests["cached_tokens"]).dtype == np.int64
    _counts, tokens = _per_request(res)
    assert list(tokens) == list(res.requests["output_tokens"])

    # the same figures as a cell that kept its records in memory, within the engine's jitter
    def rate(r):
        return _core.summarize_cell(
            r.requests, r.events, int(r.window_start_ns), int(r.window_end_ns), 1.0, -1, -1
        )["total_tok_s"]

    assert rate(res) == pytest.approx(rate(kept), rel=0.1)


# ---- the end of a cell: figures read from the event columns in bounded memory (issue 25) ----


def _synthetic(seed: int, n_req: int = 240, n_reads: int = 30_000, tie_ms: bool = False):
    """Records as a loop writes them: one clock read per socket read (t_ns never goes back;
    several requests' reads may share a t_ns), 1-3 events a read, counts 0-6, some requests
    failed, some of the warm-up, some usage-counted (their events scaled to the usage total)."""
    rng = np.random.default_rng(seed)
    req = {
        "sent_ns": np.zeros(n_req, np.int64),
        "first_token_ns": np.full(n_req, -1, np.int64),
        "done_ns": np.full(n_req, -1, np.int64),
        "outcome": rng.choice([1, 1, 1, 1, 2, 3], n_req).astype(np.uint8),
        "phase": (rng.random(n_req) > 0.1).astype(np.uint8),
        "prompt_tokens": np.full(n_req, 100, np.int64),
        "token_source": rng.choice([1, 2], n_req).astype(np.uint8),
        "slot": (np.arange(n_req) % 16).astype(np.int32),
    }
    step = rng.integers(0, 3, n_reads) * (1_000_000 if tie_ms else rng.integers(1, 4_000_000))
    t_read = np.cumsum(step) + 1_000_000_000
    q_read = rng.integers(0, n_req, n_reads)
    per = rng.integers(1, 4, n_reads)
    q = np.repeat(q_read, per).astype(np.int32)
    t = np.repeat(t_read, per).astype(np.int64)
    tok = rng.integers(0, 7, len(q)).astype(np.int32)
    chunk = np.bincount(q, weights=tok, minlength=n_req).astype(np.int64)
    req["output_tokens"] = chunk + rng.integers(-5, 30, n_req)
    for i in range(n_req):
        mine = t[q == i]
        if len(mine):
            req["sent_ns"][i] = mine[0] - 5_000_000
            req["first_token_ns"][i] = mine[0]
            req["done_ns"][i] = mine[-1]
    ev = {"request": q, "t_ns": t, "tokens": tok}
    return req, ev


def _figures_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, va in a.items():
        if isinstance(va, dict):
            _figures_equal(va, b[k])
            continue
        x, y = np.asarray(va, dtype=float), np.asarray(b[k], dtype=float)
        assert x.shape == y.shape, k
        assert np.array_equal(x, y, equal_nan=True), (k, va, b[k])


@pytest.mark.parametrize("seed,tie_ms", [(1, False), (2, True), (3, False), (4, True)])
def test_the_streamed_summary_gives_the_figures_of_the_sorted_one(seed, tie_ms):
    """Events in the loop's order are summarised in passes over the columns (the streamed
    path); the same events grouped by request (time goes back between requests) take the
    sorted copy, the derivation as it was before. Every figure must be identical, to the bit:
    gaps tied (whole ms) or not, usage scaling, failed and warm-up requests, bins of 1 s and
    of 0.25 s, windows cutting arrivals off at both ends."""
    req, ev = _synthetic(seed, tie_ms=tie_ms)
    grouped = np.argsort(ev["request"], kind="stable")
    ev_grouped = {k: v[grouped] for k, v in ev.items()}
    assert np.any(np.diff(ev_grouped["t_ns"]) < 0)  # the sorted path, surely
    t = ev["t_ns"]
    for t0, t1, bin_s in (
        (int(t[0]), int(t[-1]), 1.0),
        (int(t[len(t) // 5]) + 1, int(t[-len(t) // 7]), 0.25),
    ):
        streamed = _core.summarize_cell(req, ev, t0, t1, bin_s, t0 + 2_000_000_000, t0)
        sorted_ = _core.summarize_cell(req, ev_grouped, t0, t1, bin_s, t0 + 2_000_000_000, t0)
        assert streamed["output_tokens"] > 0 and np.isfinite(streamed["tbt_p99_ms"])
        _figures_equal(streamed, sorted_)


def test_the_end_of_cell_summary_holds_no_copy_of_the_events():
    """The summary of a cell with 3 M token events (the 512-stream, 120 s soak's count) must
    not grow the process by a copy of them: it read ~90 bytes an event (a sorted copy, the
    arrivals, the gaps twice), 270 MB here; now a few MB (per-request state, one bin's gaps,
    the rank selection's histograms). Peak RSS (VmHWM, reset first) over the RSS before."""
    n_ev, n_req = 3_000_000, 6_000
    rng = np.random.default_rng(5)
    q = rng.integers(0, n_req, n_ev).astype(np.int32)
    t = np.sort(rng.integers(0, 120_000_000_000, n_ev)).astype(np.int64)
    ev = {"request": q, "t_ns": t, "tokens": np.ones(n_ev, np.int32)}
    req = {
        "sent_ns": np.zeros(n_req, np.int64),
        "first_token_ns": np.zeros(n_req, np.int64),
        "done_ns": np.full(n_req, 120_000_000_000, np.int64),
        "outcome": np.ones(n_req, np.uint8),
        "phase": np.ones(n_req, np.uint8),
        "prompt_tokens": np.full(n_req, 100, np.int64),
    }

    def hwm_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 1024

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("this kernel cannot reset the peak RSS")
    before = rss_mb()
    fig = _core.summarize_cell(req, ev, 0, 120_000_000_000, 1.0)
    grew = hwm_mb() - before
    assert fig["output_tokens"] == n_ev
    assert grew < 40, f"the summary grew the process by {grew:.0f} MB for {n_ev:,} events"


def test_the_latency_distributions_hold_no_copy_of_the_events():
    """latency.cell_latency over 1 M time-ordered events: it held ~72 bytes an event in
    sorted copies (216 MB traced for 3 M), then the core's arrivals as numpy arrays and the
    per-token samples (172 MB for 3 M); now per-request reductions (`_core.request_tokens`) and the core's
    summary of the TBT sample set (`_core.summarize_cell`'s tbt_count, tbt_mean_ms,
    tbt_quantiles_ms): O(requests), no per-token array. numpy's allocations, traced."""
    import tracemalloc

    from speedmatrix import latency

    n_ev, n_req = 1_000_000, 1_500
    rng = np.random.default_rng(5)
    ev = {
        "request": rng.integers(0, n_req, n_ev).astype(np.int32),
        "t_ns": np.sort(rng.integers(0, 120_000_000_000, n_ev)).astype(np.int64),
        "tokens": np.ones(n_ev, np.int32),
    }
    req = {
        "scheduled_ns": np.zeros(n_req, np.int64),
        "sent_ns": np.zeros(n_req, np.int64),
        "first_token_ns": np.zeros(n_req, np.int64),
        "done_ns": np.full(n_req, 120_000_000_000, np.int64),
        "outcome": np.ones(n_req, np.uint8),
        "phase": np.ones(n_req, np.uint8),
        "output_tokens": np.full(n_req, 2000, np.int64),
    }
    tracemalloc.start()
    try:
        out = latency.cell_latency(req, ev, 0, 120_000_000_000)
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    # one sample per token of every arrival after a request's first (the core's arrivals:
    # events of a request less than 1 ms apart are one delivery)
    full = {
        **req,
        "prompt_tokens": np.zeros(n_req, np.int64),
        "token_source": np.ones(n_req, np.uint8),
    }
    a = _core.token_arrivals(full, ev, 1)
    assert out["tbt_ms"]["n"] == int(a["tokens"][np.isfinite(a["gap_ms"])].sum()) > 0.99 * n_ev
    # 0.2 MB measured (1,500 requests); a per-token array of 1 M floats would be 8 MB
    assert peak_mb < 4, f"cell_latency held {peak_mb:.1f} MB for {n_ev:,} events"


@pytest.mark.e2e
def test_a_spilled_cells_figures_read_in_place_equal_those_of_a_sorted_copy():
    """A real cell whose events spilled (the arrays are mappings of the spill files): the
    end-of-cell figures read in place from the mappings (summarize_cell streamed, latency in
    slices) equal, to the bit, those of in-memory copies of the same records put out of time
    order (the sorted derivations the end of a cell used before)."""
    from speedmatrix import latency

    with Sim("test-fast") as sim:
        res = _core.CellRunner(_spec(sim.url + "/v1/completions", spill_events=50)).run()
    assert res.fatal_error == "" and res.events_note == ""
    assert _spill_mappings() >= 4
    req, ev = res.requests, res.events
    t = np.asarray(ev["t_ns"])
    t0, t1 = int(t[len(t) // 10]), int(t[-1])
    grouped = np.argsort(np.asarray(ev["request"]), kind="stable")
    copy = {k: np.asarray(v)[grouped] for k, v in ev.items()}
    assert np.any(np.diff(copy["t_ns"]) < 0)
    fig = _core.summarize_cell(req, ev, t0, t1, 0.5, t0, t0)
    assert fig["output_tokens"] > 100 and np.isfinite(fig["tbt_p99_ms"])
    _figures_equal(fig, _core.summarize_cell(req, copy, t0, t1, 0.5, t0, t0))
    tbt = latency.cell_latency(req, ev, t0, t1)["tbt_ms"]
    assert tbt["n"] > 100
    _figures_equal(tbt, latency.cell_latency(req, copy, t0, t1)["tbt_ms"])
