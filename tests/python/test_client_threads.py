"""Many event loops (``--client-threads``, docs/SCALE.md): the figures of a cell do not
depend on how many loops received it. End-to-end tier: the same cells against the
built-in engine's ``fixed`` profile (every request its own schedule: TTFT, then one
token per ITL, no running cap), run with 1 and with 2 or 3 loops, closed and open loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
from speedmatrix._native import _core
from speedmatrix.records import Records
from speedmatrix.sim import Sim

pytestmark = pytest.mark.e2e

ITL_MS = 20.0
TOKENS = 20
BODY = {"prompt": "hello", "max_tokens": TOKENS, "ignore_eos": True, "stream": True}


def _spec(url: str, threads: int, **kw) -> _core.CellSpec:
    spec = _core.CellSpec()
    spec.url = url
    spec.bodies = [json.dumps({**BODY, "prompt": p}).encode() for p in ("a", "b", "c")]
    spec.warmup_bodies = [json.dumps({**BODY, "max_tokens": 1}).encode()] * 4
    spec.concurrency = 8
    spec.duration_s = 3.0
    spec.client_threads = threads
    for k, v in kw.items():
        setattr(spec, k, v)
    return spec


def _figures(res) -> dict:
    assert not res.fatal_error, res.fatal_error
    return _core.summarize_cell(
        res.requests,
        res.events,
        int(res.window_start_ns),
        int(res.window_end_ns),
        1.0,
        -1,
        int(res.ramp_start_ns),
    )


@pytest.fixture(scope="module")
def engine():
    with Sim("fixed", overrides={"fixed_itl_ms": ITL_MS}) as sim:
        yield sim.url + "/v1/completions"


def test_closed_loop_figures_do_not_depend_on_the_loops(engine):
    one = _core.CellRunner(_spec(engine, 1)).run()
    two = _core.CellRunner(_spec(engine, 2)).run()
    assert (one.client_threads, two.client_threads) == (1, 2)
    f1, f2 = _figures(one), _figures(two)
    # the engine's own pace, read the same through either client (tail percentiles are
    # left out: on this shared 2-core machine they move with the load of the moment)
    for name in ("decode_tok_s_per_request", "total_tok_s", "ttft_ms", "tbt_ms"):
        assert f2[name] == pytest.approx(f1[name], rel=0.05), (name, f1[name], f2[name])
    assert f1["decode_tok_s_per_request"] == pytest.approx(1000 / ITL_MS, rel=0.05)
    for res in (one, two):
        req = res.requests
        window = req["phase"] == 1
        # every slot ran, each with its own body (slot k sends bodies[k % 3])
        assert sorted(set(req["slot"][window].tolist())) == list(range(8))
        assert np.array_equal(req["body"][window], req["slot"][window] % 3)
        assert not np.any(req["outcome"] == 3), "no request failed"
        # requests in send order per phase, events in time order: one loop's records
        assert np.all(np.diff(req["sent_ns"][window]) >= 0)
        assert np.all(np.diff(res.events["t_ns"]) >= 0)
    # the records read back as one Records, with the loops they ran with
    assert Records.from_result(two).client_threads == 2


def test_open_loop_figures_do_not_depend_on_the_loops(engine):
    kw = {"mode": "open", "arrival": "poisson", "rate_per_s": 20.0, "seed": 11}
    one = _core.CellRunner(_spec(engine, 1, **kw)).run()
    three = _core.CellRunner(_spec(engine, 3, **kw)).run()
    assert three.client_threads == 3
    # one schedule, dealt: the same arrivals at the same offsets from t0
    for a, b in ((one, three),):
        sa = a.requests["scheduled_ns"][a.requests["phase"] == 1] - a.window_start_ns
        sb = b.requests["scheduled_ns"][b.requests["phase"] == 1] - b.window_start_ns
        assert np.array_equal(np.sort(sa), np.sort(sb))
    f1, f3 = _figures(one), _figures(three)
    for name in ("decode_tok_s_per_request", "ttft_ms", "tbt_ms"):
        assert f3[name] == pytest.approx(f1[name], rel=0.05), (name, f1[name], f3[name])
