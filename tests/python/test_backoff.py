"""A server that pushes back: 429 / Retry-After and refused connections.

The C++ core makes a slot wait (cpp/include/speedmatrix/scheduler.hpp BackoffPolicy)
and ends a cell whose server keeps refusing; its result carries `backoffs`,
`backoff_s`, `stopped_by` "unreachable" and `stop_reason`. Here: those figures travel
through the saved records into the cell's verdict (rate_limited flag, the reason of
an unreachable cell), and one real cell through the bindings.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from speedmatrix import runfile
from speedmatrix.records import Records
from speedmatrix.verdict import CellShape, EngineFacts, Rules, decode_cell

NS = 1_000_000_000


def _records(*, rate_limited: bool, stopped_by: str = "duration", stop_reason: str = ""):
    """Two slots over a 4 s window from t0 = 1 s: slot 0 streams 10 ms tokens through the
    window; slot 1's first request is answered 429 at 1.1 s and (the core having made the
    slot wait its Retry-After of 1 s) its next is sent at 2.1 s and streams to the end."""
    rows = [(0, 1.0, 1.1, 5.0, 1, "")]
    if rate_limited:
        rows += [(1, 1.0, None, 1.1, 3, "http_429"), (1, 2.1, 2.2, 5.0, 1, "")]
    else:
        rows += [(1, 1.0, 1.1, 5.0, 1, "")]
    n = len(rows)
    req = {
        "slot": np.array([r[0] for r in rows], np.int32),
        "body": np.zeros(n, np.int32),
        "phase": np.ones(n, np.uint8),
        "scheduled_ns": np.array([int(r[1] * NS) for r in rows], np.int64),
        "sent_ns": np.array([int(r[1] * NS) for r in rows], np.int64),
        "first_byte_ns": np.array([int(r[1] * NS) + 10**6 for r in rows], np.int64),
        "first_token_ns": np.array([-1 if r[2] is None else int(r[2] * NS) for r in rows]),
        "done_ns": np.array([int(r[3] * NS) for r in rows], np.int64),
        "http_status": np.array([429 if r[5] else 200 for r in rows], np.int32),
        "prompt_tokens": np.full(n, 100, np.int64),
        "output_tokens": np.zeros(n, np.int64),
        "token_source": np.full(n, 3, np.uint8),
        "outcome": np.array([r[4] for r in rows], np.uint8),
        "finish_reason": [""] * n,
        "error_kind": [r[5] for r in rows],
        "error_message": ["slow down (Retry-After 1000 ms)" if r[5] else "" for r in rows],
    }
    events = []
    for i, r in enumerate(rows):
        if r[2] is not None:
            t = r[2]
            while t < r[3]:
                events.append((i, t))
                t += 0.01
    ev = {
        "request": np.array([e[0] for e in events], np.int32),
        "t_ns": np.array([round(e[1] * NS) for e in events], np.int64),
        "tokens": np.ones(len(events), np.int32),
    }
    return Records(
        requests=req,
        events=ev,
        ramp_start_ns=1 * NS,
        stopped_by=stopped_by,
        stop_reason=stop_reason,
        backoffs=1 if rate_limited else 0,
        backoff_s=1.0 if rate_limited else 0.0,
        window_start_ns=1 * NS,
        window_end_ns=5 * NS,
        warmup_start_ns=-1,
        end_ns=5 * NS,
    )


def _verdict(records: Records) -> dict:
    shape = CellShape(
        id="decode-c100-n2-r0", phase="decode", context=100, label="100", concurrency=2
    )
    return decode_cell(shape, records, EngineFacts(), Rules(), idle=True)


def test_a_rate_limited_cell_says_so_with_its_waits():
    cell = _verdict(_records(rate_limited=True))
    assert "rate_limited" in cell["flags"]
    assert cell["errors"] == {"http_429": 1}
    assert cell["backoffs"] == 1 and cell["backoff_s"] == pytest.approx(1.0)
    plain = _verdict(_records(rate_limited=False))
    assert "rate_limited" not in plain["flags"]
    assert plain["backoffs"] == 0 and plain["backoff_s"] == 0.0
    assert plain["status"] == "valid"


def test_an_unreachable_cell_is_an_error_with_the_cores_reason():
    why = "the server refused 9 connections in a row over 10.1 s (Couldn't connect to server)"
    cell = _verdict(_records(rate_limited=False, stopped_by="unreachable", stop_reason=why))
    assert cell["status"] == "error"
    assert cell["reason"] == why
    assert cell["stopped_by"] == "unreachable"


def test_the_backoff_stamps_survive_the_records_file(tmp_path):
    why = "the server refused 9 connections in a row over 10.1 s"
    rec = _records(rate_limited=True, stopped_by="unreachable", stop_reason=why)
    rel = runfile.save_records(
        tmp_path, "decode-c100-n2-r0", rec.requests, rec.events, stamps=rec.stamps()
    )
    back = Records.from_loaded(runfile.load_records(tmp_path, rel))
    assert (back.backoffs, back.backoff_s) == (1, pytest.approx(1.0))
    assert (back.stopped_by, back.stop_reason) == ("unreachable", why)
    # a cell stored before these stamps: zero waits, no reason
    old = Records.from_loaded({"requests": rec.requests, "events": rec.events}, {})
    assert (old.backoffs, old.backoff_s, old.stop_reason) == (0, 0.0, "")


def test_a_refusing_server_ends_a_real_cell_through_the_bindings():
    from speedmatrix._native import _core

    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        spec = _core.CellSpec()
        spec.url = f"http://127.0.0.1:{port}/v1/completions"
        spec.bodies = ['{"prompt":"a","stream":true}']
        spec.concurrency = 2
        spec.duration_s = 60
        spec.unreachable_after_s = 0.5
        res = _core.CellRunner(spec).run()
    assert res.stopped_by == "unreachable"
    assert res.stop_reason.startswith("the server refused "), res.stop_reason
    assert (res.window_end_ns - res.window_start_ns) / NS < 5  # not the 60 s window
    assert res.backoffs > 0 and res.backoff_s > 0
    assert len(res.requests["slot"]) < 20  # backing off, not 20 tries per slot per second
    cell = _verdict(Records.from_result(res))
    assert cell["status"] == "error" and cell["reason"] == res.stop_reason
