"""The verdict's newer flags through `decode_cell` on synthetic records (a usage that
disagrees with the stream, a warm-up that never finished, coalesced delivery), and a
usage that lies through the real decoder against a loopback server (e2e)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from speedmatrix.records import Records
from speedmatrix.verdict import CellShape, EngineFacts, Rules, decode_cell

NS = 1_000_000_000
SHAPE = CellShape(id="decode-c100-n2-r0", phase="decode", context=100, label="100", concurrency=2)


def _records(
    token_source=(2, 2),
    warmup=(),
    per_request_tokens: int = 50,
    window_s: float = 2.0,
    burst: bool = False,
) -> Records:
    """Two window requests streaming 40 ms tokens over [1 s, 1 s + window_s], each
    ``token_source``; ``warmup``: (body, outcome) of warm-up tries sent at 0.1 s; ``burst``:
    each stream's tokens come two at a time, 50 us apart, every 80 ms (a buffering proxy)."""
    rows = [(0, b, 0.1, 0.2, 0.5, o) for b, o in warmup]
    rows += [(1, 0, 1.0, 1.05, 1.0 + window_s, 1), (1, 1, 1.0, 1.05, 1.0 + window_s, 1)]
    n = len(rows)
    sources = [2] * len(warmup) + list(token_source)
    req = {
        "slot": np.array([r[1] for r in rows], np.int32),
        "body": np.array([r[1] for r in rows], np.int32),
        "phase": np.array([r[0] for r in rows], np.uint8),
        "scheduled_ns": np.array([int(r[2] * NS) for r in rows], np.int64),
        "sent_ns": np.array([int(r[2] * NS) for r in rows], np.int64),
        "first_byte_ns": np.array([int(r[3] * NS) for r in rows], np.int64),
        "first_token_ns": np.array([int(r[3] * NS) if r[5] == 1 else -1 for r in rows]),
        "done_ns": np.array([int(r[4] * NS) for r in rows], np.int64),
        "http_status": np.full(n, 200, np.int32),
        "prompt_tokens": np.full(n, 100, np.int64),
        "output_tokens": np.full(n, per_request_tokens, np.int64),
        "token_source": np.array(sources, np.uint8),
        "outcome": np.array([r[5] for r in rows], np.uint8),
        "finish_reason": [""] * n,
        "error_kind": ["" if r[5] != 3 else "timeout" for r in rows],
        "error_message": [""] * n,
    }
    events = []
    for i, r in enumerate(rows):
        if r[0] == 1:
            # streams on their own connections never share a read's clock stamp
            t = r[3] + 0.005 * i
            while t < r[4]:
                events.append((i, t))
                if burst:
                    events.append((i, t + 50e-6))
                t += 0.08 if burst else 0.04
    ev = {
        "request": np.array([e[0] for e in events], np.int32),
        "t_ns": np.array([round(e[1] * NS) for e in events], np.int64),
        "tokens": np.ones(len(events), np.int32),
    }
    return Records(
        requests=req,
        events=ev,
        ramp_start_ns=1 * NS,
        stopped_by="duration",
        window_start_ns=int(1.05 * NS),
        window_end_ns=int((1.0 + window_s) * NS),
        warmup_start_ns=int(0.1 * NS),
        end_ns=int((1.0 + window_s) * NS),
    )


def _cell(records: Records, rules: Rules | None = None) -> dict:
    return decode_cell(SHAPE, records, EngineFacts(), rules or Rules(), idle=True)


def test_an_honest_cell_has_none_of_the_new_flags_nor_their_fields():
    cell = _cell(_records())
    assert cell["status"] == "valid" and cell["flags"] == []
    assert "usage_mismatch" not in cell and "warmup_unfinished" not in cell


@pytest.mark.parametrize(
    ("sources", "below", "above"), [((4, 2), 1, 0), ((5, 5), 0, 2), ((4, 5), 1, 1)]
)
def test_a_usage_that_disagrees_with_the_stream_is_flagged_per_request(sources, below, above):
    cell = _cell(_records(token_source=sources))
    assert cell["flags"] == ["usage_mismatch"]
    assert cell["usage_mismatch"] == {"below_chunks": below, "above_chunks": above}
    assert cell["status"] == "valid"


def test_a_warmup_that_never_finished_is_flagged():
    # body 1 timed out on both tries; body 0 finished
    cell = _cell(_records(warmup=[(0, 1), (1, 2), (1, 3)]))
    assert cell["flags"] == ["warmup_unfinished"]
    assert cell["warmup_unfinished"] == 1
    retried = _cell(_records(warmup=[(0, 1), (1, 2), (1, 1)]))
    assert retried["flags"] == [] and "warmup_unfinished" not in retried


def test_coalesced_delivery_is_flagged_from_the_cells_coalesced_share():
    bursty = _cell(_records(burst=True))
    assert bursty["coalesced_share"] == 1.0 and bursty["flags"] == ["coalesced_delivery"]
    assert _cell(_records(burst=True), Rules(coalesced_share_max=1.0))["flags"] == []
    paced = _cell(_records())
    assert paced["coalesced_share"] == 0.0 and paced["flags"] == []


# ---- e2e: a server whose final usage says 1 token for 16 streamed chunks ---------------
CHUNKS = 16


class _LyingUsage(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for _ in range(CHUNKS):
                self.wfile.write(b'data: {"choices":[{"text":"x"}]}\n\n')
                self.wfile.flush()
                time.sleep(0.005)
            usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}
            self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the window's end cut the stream
            pass

    def log_message(self, *args):
        pass


@pytest.mark.e2e
def test_a_usage_below_the_chunks_is_counted_as_received_and_flagged():
    from speedmatrix._native import _core

    server = ThreadingHTTPServer(("127.0.0.1", 0), _LyingUsage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        spec = _core.CellSpec()
        spec.url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
        spec.bodies = ['{"prompt":"a","stream":true}']
        spec.concurrency = 1
        spec.duration_s = 1.0
        spec.max_requests = 20
        res = _core.CellRunner(spec).run()
    finally:
        server.shutdown()
        server.server_close()
    records = Records.from_result(res)
    req = records.requests
    done = (req["phase"] == 1) & (req["outcome"] == 1)
    assert done.sum() >= 2
    assert set(req["output_tokens"][done].tolist()) == {CHUNKS}  # not the usage's 1
    assert set(req["token_source"][done].tolist()) == {4}
    cell = decode_cell(
        CellShape(id="decode-c4-n1-r0", phase="decode", context=4, label="4", concurrency=1),
        records,
        EngineFacts(),
        Rules(),
        idle=True,
    )
    assert "usage_mismatch" in cell["flags"]
    assert cell["usage_mismatch"]["below_chunks"] >= int(done.sum())
    # total tok/s counts every text chunk: about 16 tokens per ~90 ms request
    assert cell["output_tokens"] >= CHUNKS * (int(done.sum()) - 1)


@pytest.mark.parametrize(
    ("idle", "prompt_tokens", "flags"),
    [
        (True, 100, []),
        (False, 100, ["busy_at_start"]),
        (True, 99, ["prompt_mismatch"]),
        (False, 101, ["busy_at_start", "prompt_mismatch"]),
    ],
)
def test_prefill_flags(idle, prompt_tokens, flags):
    from speedmatrix.verdict import prefill_cell

    records = _records()
    records.requests["prompt_tokens"][:] = prompt_tokens
    shape = CellShape(
        id="prefill-c100-r0", phase="prefill", context=100, label="100", concurrency=1
    )
    cell = prefill_cell(shape, records, idle=idle)
    assert cell["flags"] == flags and cell["status"] == "valid"


@pytest.mark.e2e
def test_a_warmup_prompt_the_engine_always_refuses_flags_the_cell():
    # the built-in engine answers the second warm-up prompt 500 on both tries; the window
    # runs all the same, and the cell says its warm-up never finished
    from speedmatrix._native import _core
    from speedmatrix.sim import Sim

    good = b'{"prompt":"hello","max_tokens":8,"stream":true}'
    refused = b'{"prompt":"hello","max_tokens":8,"stream":true,"sm_fault":"http_500"}'
    with Sim("test-fast") as sim:
        spec = _core.CellSpec()
        spec.url = sim.url + "/v1/completions"
        spec.bodies = [good]
        spec.warmup_bodies = [good, refused]
        spec.concurrency = 1
        spec.duration_s = 0.5
        res = _core.CellRunner(spec).run()
    records = Records.from_result(res)
    assert res.warmup_retried == 1
    shape = CellShape(id="decode-c4-n1-r0", phase="decode", context=4, label="4", concurrency=1)
    cell = decode_cell(shape, records, EngineFacts(), Rules(), idle=True)
    assert cell["status"] == "valid", cell.get("reason")
    assert "warmup_unfinished" in cell["flags"] and cell["warmup_unfinished"] == 1
