"""Steady-state windows, the stall rule, per-request decode speed and the precision stop
(issue 12), through the compiled core.

Fast tier: the precision stop and the figures on synthetic records (the C++ table tests
in tests/cpp/test_stats.cpp and test_scheduler.cpp hold the rules themselves; here the
bindings are checked to carry them). Tests marked ``e2e`` run real cells in real time
against a local server (127.0.0.1 only), each bounded to a few seconds.
"""

from __future__ import annotations

import json
import math
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from speedmatrix._native import _core
from speedmatrix.sim import Sim

# ---------------------------------------------------------------- fast tier


@pytest.mark.parametrize(
    "total, total_ci, tbt, tbt_ci, target, elapsed, stop, reached",
    [
        (1000.0, (990.0, 1010.0), 20.0, (19.8, 20.2), 0.02, 6.0, True, 0.01),
        (1000.0, (990.0, 1010.0), 20.0, (19.8, 20.2), 0.02, 4.0, False, 0.01),  # < minimum
        (1000.0, (970.0, 1030.0), 20.0, (19.8, 20.2), 0.02, 6.0, False, 0.03),
        (1000.0, (990.0, 1010.0), 20.0, (19.4, 20.6), 0.02, 6.0, False, 0.03),
        (1000.0, (math.nan, math.nan), 20.0, (19.8, 20.2), 0.02, 60.0, False, math.nan),
    ],
)
def test_precision_stop_binding(total, total_ci, tbt, tbt_ci, target, elapsed, stop, reached):
    got_stop, got = _core.precision_stop(total, total_ci, tbt, tbt_ci, target, elapsed, 5.0)
    assert got_stop is stop
    if math.isnan(reached):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(reached)


def _records(rows, events):
    """rows: (slot, sent, first, done, outcome); events: (request, t, tokens); seconds."""
    ns = 1_000_000_000
    req = {
        "slot": np.array([r[0] for r in rows], np.int32),
        "sent_ns": np.array([int(r[1] * ns) for r in rows], np.int64),
        "first_token_ns": np.array([int(r[2] * ns) for r in rows], np.int64),
        "done_ns": np.array([int(r[3] * ns) if r[3] is not None else -1 for r in rows], np.int64),
        "outcome": np.array([r[4] for r in rows], np.uint8),
        "phase": np.ones(len(rows), np.uint8),
        "prompt_tokens": np.full(len(rows), 100, np.int64),
    }
    ev = {
        "request": np.array([e[0] for e in events], np.int32),
        "t_ns": np.array([round(e[1] * ns) for e in events], np.int64),
        "tokens": np.array([e[2] for e in events], np.int32),
    }
    return req, ev


def test_decode_speed_per_request_survives_multi_token_chunks():
    # One request at 100 tok/s whose chunks carry 1..6 tokens (each chunk leaves when
    # its last token is done): 1000 / median TBT reads the chunking, the new figure does not.
    rng = random.Random(3)
    events, t, k_total = [], 0.0, 0
    while t < 4.0:
        k = rng.randint(1, 6)
        k_total += k
        t = k_total * 0.01
        events.append((0, t, k))
    req, ev = _records([(0, 0.0, events[0][1], None, 2)], events)
    f = _core.summarize_cell(req, ev, int(0.5e9), int(3.5e9), 1.0, -1, 0)
    assert f["decode_tok_s_per_request"] == pytest.approx(100.0, rel=1e-6)
    assert f["decode_requests"] == 1
    # the same stream with one token per chunk: both figures agree
    single = [(0, (i + 1) * 0.01, 1) for i in range(400)]
    req1, ev1 = _records([(0, 0.0, 0.01, None, 2)], single)
    g = _core.summarize_cell(req1, ev1, int(0.5e9), int(3.5e9))
    assert g["decode_tok_s_per_request"] == pytest.approx(100.0, rel=1e-6)
    assert g["per_request_tok_s"] == pytest.approx(100.0, rel=1e-6)


def test_first_wave_ttft_and_ttft_from_the_ramp():
    # Slot 0: first wave sent at 0 (TTFT 1 s), refill at 2 s (TTFT 0.1 s); slot 1: sent at
    # 0, TTFT 1.5 s. The window opens at 1.5 s (every slot streams).
    rows = [(0, 0.0, 1.0, 2.0, 1), (1, 0.0, 1.5, None, 2), (0, 2.0, 2.1, None, 2)]
    events = [(0, 1.0 + 0.1 * i, 1) for i in range(11)]
    events += [(1, 1.5 + 0.1 * i, 1) for i in range(15)]
    events += [(2, 2.1 + 0.1 * i, 1) for i in range(9)]
    req, ev = _records(rows, events)
    t0, t1 = int(1.5e9), int(3.0e9)
    f = _core.summarize_cell(req, ev, t0, t1, 1.0, -1, 0)
    assert f["ttft_ms"] == pytest.approx(1000.0)  # median of 1000, 1500, 100
    assert f["ttft_first_wave_ms"] == pytest.approx(1250.0)
    # tokens before t0 count in no figure
    assert f["output_tokens"] == sum(1 for e in events if 1.5 <= e[1] <= 3.0)


# ---------------------------------------------------------------- e2e (real time)


class _ChunkServer:
    """An OpenAI-style completions server at 100 tok/s per request, with continuous usage
    so the client counts every token. ``chunked``: chunks carry 1..6 tokens, each sent
    when its last token is due on an even 10 ms schedule. ``skewed``: one token per
    chunk, three at a time 2 ms apart every 30 ms (the median gap is 2 ms: reads further
    apart than one delivery, kDeliveryNs = 1 ms, so each token is its own arrival)."""

    STEP_S = 0.010

    def due(self, i: int) -> float:
        """Seconds after the first token at which token i (0-based) is due."""
        if self.schedule == "skewed":
            return (i // 3) * 0.030 + (i % 3) * 0.002
        return i * self.STEP_S

    def __init__(self, tokens: int = 400, schedule: str = "chunked") -> None:
        self.schedule = schedule
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once

            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(n)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                rng = random.Random()
                start = time.monotonic() + 0.05  # TTFT 50 ms
                done = 0
                try:
                    while done < outer.tokens:
                        k = 1 if outer.schedule == "skewed" else rng.randint(1, 6)
                        k = min(k, outer.tokens - done)
                        done += k
                        due = start + outer.due(done - 1)
                        time.sleep(max(0.0, due - time.monotonic()))
                        chunk = {
                            "object": "text_completion",
                            "choices": [{"index": 0, "text": " w" * k, "finish_reason": None}],
                            "usage": {"prompt_tokens": 8, "completion_tokens": done},
                        }
                        self._chunk(f"data: {json.dumps(chunk)}\n\n")
                    self._chunk("data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _chunk(self, text: str) -> None:
                b = text.encode()
                self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                self.wfile.flush()

        self.tokens = tokens
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/completions"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _spec(url: str, n: int, duration_s: float, body: bytes, **kw):
    spec = _core.CellSpec()
    spec.url = url
    spec.bodies = [body]
    spec.concurrency = n
    spec.duration_s = duration_s
    for k, v in kw.items():
        setattr(spec, k, v)
    return spec


def _figures(res):
    return _core.summarize_cell(
        res.requests,
        res.events,
        int(res.window_start_ns),
        int(res.window_end_ns),
        1.0,
        -1,
        int(res.ramp_start_ns),
    )


@pytest.mark.e2e
@pytest.mark.parametrize("schedule", ["chunked", "skewed"])
def test_multi_token_chunks_give_the_step_rate_per_request(schedule):
    with _ChunkServer(schedule=schedule) as srv:
        res = _core.CellRunner(_spec(srv.url, 4, 3.0, b'{"prompt":"x","stream":true}')).run()
    assert not res.fatal_error
    f = _figures(res)
    # the server's own decode rate: 100 tok/s per request
    assert f["decode_tok_s_per_request"] == pytest.approx(100.0, rel=0.02), f
    assert f["decode_requests"] >= 4
    if schedule == "skewed":
        # the seed's 1000 / median TBT reads the skew (median gap 2 ms), not the rate:
        # why the report keeps it only as the seed's column
        assert f["per_request_tok_s"] > 300


@pytest.mark.e2e
def test_stalled_streams_are_cut_counted_and_leave_good_figures():
    # test-fast: TTFT 50 ms, 20 ms per token (50 tok/s per request); 20% of the requests
    # go silent after 3 tokens. The window request's stall limit is max(0.5 s, 25 x 20 ms).
    body = b'{"model":"sim-test","prompt":"a b c","max_tokens":40,"stream":true}'
    with Sim("test-fast", faults={"stall": 0.2}, seed=5) as sim:
        spec = _spec(sim.url + "/v1/completions", 4, 4.0, body, stall_min_s=0.5)
        t = time.monotonic()
        res = _core.CellRunner(spec).run()
        took = time.monotonic() - t
        assert sim.wait_idle(timeout_s=5)  # every cut stream was freed on the server
    assert not res.fatal_error
    assert took < 4.0 + 2.0  # ramp + window + the last cut: no 120 s idle timeout
    f = _figures(res)
    kinds = [k for k, o in zip(res.requests["error_kind"], res.requests["outcome"]) if o == 3]
    assert res.stalls >= 1 and kinds.count("stall") == res.stalls
    assert f["errors"] == len(kinds)
    # good streams only: the engine's 20 ms per token
    assert f["tbt_ms"] == pytest.approx(20.0, rel=0.05)
    assert f["decode_tok_s_per_request"] == pytest.approx(50.0, rel=0.05)
    assert f["error_slot_s"] > 0.5 * res.stalls * 0.9  # each stall held its slot >= 0.5 s


@pytest.mark.e2e
def test_a_cell_that_never_streams_is_bounded_by_the_ramp_cap_and_window():
    # A server that answers with headers and then nothing: the ramp cap opens the window,
    # the window ends at D, the cell ends within cap + D.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    conns = []

    def serve():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            conns.append(c)
            c.recv(65536)
            c.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )

    threading.Thread(target=serve, daemon=True).start()
    try:
        spec = _spec(
            f"http://127.0.0.1:{port}/v1/completions",
            2,
            1.0,
            b'{"prompt":"x","stream":true}',
            ramp_cap_s=1.0,
        )
        t = time.monotonic()
        res = _core.CellRunner(spec).run()
        took = time.monotonic() - t
    finally:
        lsock.close()
        for c in conns:
            c.close()
    assert res.ramp_capped
    assert (res.window_start_ns - res.ramp_start_ns) / 1e9 == pytest.approx(1.0, abs=0.15)
    assert (res.window_end_ns - res.window_start_ns) / 1e9 == pytest.approx(1.0, abs=1e-6)
    assert took < 3.0
    assert res.stopped_by == "duration"


@pytest.mark.e2e
def test_precision_stop_ends_a_steady_cell_early():
    # test-fast streams are regular: 2% is reached long before the 20 s cap.
    body = b'{"model":"sim-test","prompt":"a b c","max_tokens":100,"stream":true}'
    with Sim("test-fast") as sim:
        spec = _spec(sim.url + "/v1/completions", 8, 20.0, body, precision=0.02, min_duration_s=3.0)
        t = time.monotonic()
        res = _core.CellRunner(spec).run()
        took = time.monotonic() - t
    assert res.stopped_by == "precision"
    d = (res.window_end_ns - res.window_start_ns) / 1e9
    assert 3.0 <= d < 20.0 and took < 15.0
    f = _figures(res)
    assert f["precision"] <= 0.02
    assert f["total_tok_s"] == pytest.approx(8 * 50.0, rel=0.05)


def test_matrix_precision_fields():
    from speedmatrix.matrix import Matrix, parse_precision

    m = Matrix(precision="2%", min_duration_s="4s", duration_s=30)
    assert m.precision == pytest.approx(0.02) and m.min_duration_s == 4.0
    assert m.problems() == []
    assert Matrix.from_dict({"precision": 0.05, "min_duration": "3s"}).min_duration_s == 3.0
    assert parse_precision("0.5%") == pytest.approx(0.005)
    with pytest.raises(ValueError, match="precision"):
        Matrix(precision="two percent")
    with pytest.raises(ValueError, match="precision"):
        parse_precision("150%")
    bad = Matrix(precision=0.02, min_duration_s=60, duration_s=30).problems()
    assert any(p.startswith("min_duration_s:") for p in bad)
    assert any(p.startswith("precision:") for p in Matrix(precision=1.5).problems())
    # without a precision target a short window is fine (the quick preset's 3 s)
    assert Matrix(duration_s=3).problems() == []


def test_cli_precision_flags_reach_the_matrix():
    from speedmatrix.cli import UsageError, build_parser
    from speedmatrix.cli.run import matrix_from_args

    def matrix(*flags):
        args = build_parser().parse_args(["run", "--url", "http://127.0.0.1:1", *flags])
        return matrix_from_args(args)

    m = matrix("--precision", "2%", "--min-duration", "3s", "--duration", "60s")
    assert (m.precision, m.min_duration_s, m.duration_s) == (pytest.approx(0.02), 3.0, 60.0)
    with pytest.raises(UsageError, match="precision"):
        matrix("--precision", "lots")
    with pytest.raises(UsageError, match="min_duration_s"):
        matrix("--precision", "2%", "--min-duration", "90s", "--duration", "30s")


def _seed_bodies(n: int, context: int, max_tokens: int, tail: int = 512):
    """n prompts of `context` words (a token is a word to the built-in engine) sharing
    all but their last `tail` words, as the demo's prompts do."""
    shared = " ".join(f"s{i % 97}" for i in range(context - tail))
    out = []
    for k in range(n):
        prompt = shared + " " + " ".join(f"u{k}x{i}" for i in range(tail))
        body = {
            "model": "muse-glimmer",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        out.append(json.dumps(body).encode())
    return out


@pytest.mark.e2e
@pytest.mark.slow
def test_long_ramp_cell_reads_the_same_over_5_and_30_s():
    # seed-h200 at 32K x 32: the 32 first tokens take ~3 s (the seed's TTFT 3,244 ms).
    # One 30 s steady-state window; its first 5 s give the 5 s figure (a window that
    # ended there would hold the same tokens). Within 3% of each other, while a window
    # opened at the send (the old rule) reads far lower over 5 s.
    n, context = 32, 32768
    with Sim("seed-h200") as sim:
        spec = _spec(sim.url + "/v1/completions", n, 30.0, b"")
        spec.bodies = _seed_bodies(n, context, 4096)
        spec.warmup_bodies = _seed_bodies(n, context, 1)
        res = _core.CellRunner(spec).run()
    assert not res.fatal_error and not res.ramp_capped
    t0, ramp = int(res.window_start_ns), int(res.ramp_start_ns)
    assert (t0 - ramp) / 1e9 > 1.0  # a long ramp indeed

    def total(a, b):
        return _core.summarize_cell(res.requests, res.events, a, b)["total_tok_s"]

    long, short = total(t0, t0 + 30 * 10**9), total(t0, t0 + 5 * 10**9)
    assert short == pytest.approx(long, rel=0.03), (short, long)
    assert long == pytest.approx(1378.7, rel=0.10)  # the seed's figure
    assert total(ramp, ramp + 5 * 10**9) < 0.9 * long  # the ramp inside the window


# ---------------------------------------------------------------- the verdict's rules


def _verdict_records(*, steady: bool, capped: bool = False, stall: bool = False):
    """Two slots over a 4 s window from t0 = 1 s after the ramp's start: slot 0 streams
    from 0.5 s, slot 1 from 1.0 s, 10 ms per token; optionally slot 1's first request
    stalls at 2 s and is cut at 3 s (refilled, streaming again from 3.1 s)."""
    from speedmatrix.records import Records

    rows = [(0, 0.0, 0.5, None, 2), (1, 0.0, 1.0, 3.0 if stall else None, 3 if stall else 2)]
    events = [(0, 0.5 + 0.01 * i, 1) for i in range(451)]
    events += [(1, 1.0 + 0.01 * i, 1) for i in range(101 if stall else 401)]
    if stall:
        rows.append((1, 3.0, 3.1, None, 2))
        events += [(2, 3.1 + 0.01 * i, 1) for i in range(191)]
    # the whole cell 1 s after the clock's zero (a real clock never reads 0)
    rows = [(r[0], r[1] + 1, r[2] + 1, None if r[3] is None else r[3] + 1, r[4]) for r in rows]
    events = [(e[0], e[1] + 1, e[2]) for e in events]
    req, ev = _records(rows, events)
    n = len(rows)
    req.update(
        body=np.zeros(n, np.int32),
        output_tokens=np.zeros(n, np.int64),
        token_source=np.full(n, 3, np.uint8),
        error_kind=["stall" if r[4] == 3 else "" for r in rows],
        error_message=["no token for 1000 ms" if r[4] == 3 else "" for r in rows],
        first_byte_ns=req["first_token_ns"].copy(),
        scheduled_ns=req["sent_ns"].copy(),
        http_status=np.full(n, 200, np.int32),
        finish_reason=[""] * n,
    )
    return Records(
        requests=req,
        events=ev,
        ramp_start_ns=10**9 if steady else -1,
        ramp_capped=capped,
        stopped_by="duration",
        stalls=int(stall),
        window_start_ns=2 * 10**9,
        window_end_ns=6 * 10**9,
        warmup_start_ns=-1,
        end_ns=6 * 10**9,
    )


def _verdict(records):
    from speedmatrix.verdict import CellShape, EngineFacts, Rules, decode_cell

    shape = CellShape(
        id="decode-c100-n2-r0", phase="decode", context=100, label="100", concurrency=2
    )
    return decode_cell(shape, records, EngineFacts(), Rules(), idle=True)


@pytest.mark.parametrize(
    "steady, capped, stall, ttft_ms, flags, status",
    [
        # steady: TTFT over the first wave (500, 1000 ms), ramp 1 s, no flag
        (True, False, False, 750.0, set(), "valid"),
        # the ramp cap opened it: long_ramp
        (True, True, False, 750.0, {"long_ramp"}, "valid"),
        # a stall: counted, flagged, the cell an error (1 of 3 requests failed > 5%)
        (True, False, True, 500.0, {"stalls"}, "error"),
        # a run saved before steady windows: t0 was the send; TTFT of requests sent in
        # [t0, t1] only: none here
        (False, False, False, None, set(), "valid"),
    ],
)
def test_verdict_of_steady_windows(steady, capped, stall, ttft_ms, flags, status):
    cell = _verdict(_verdict_records(steady=steady, capped=capped, stall=stall))
    assert cell["status"] == status, cell.get("reason")
    assert set(cell["flags"]) == flags
    if ttft_ms is None:
        assert cell["ttft_ms"] is None
    else:
        # stall case: 500 (slot 0), 100 (refill), and slot 1's first 1000 ms -> 500
        assert cell["ttft_ms"] == pytest.approx(ttft_ms)
    assert cell["total_tok_s"] == pytest.approx(
        sum(
            1
            for e in _verdict_records(steady=steady, stall=stall).events["t_ns"]
            if 2e9 <= e <= 6e9
        )
        / 4.0
    )
    if steady:
        assert cell["ramp_s"] == pytest.approx(1.0, abs=1e-6)
        assert cell["ttft_first_wave_ms"] == pytest.approx(750.0)
        assert cell["decode_tok_s_per_request"] == pytest.approx(100.0, rel=1e-3)
        assert cell["stopped_by"] == "duration"
    if stall:
        assert cell["stalls"] == 1 and cell["errors"] == {"stall": 1}
        assert cell["error_slot_s"] == pytest.approx(1.0, abs=0.02)  # silent 2.0 -> 3.0 s
        assert cell["tbt_ms"] == pytest.approx(10.0)  # good streams only


@pytest.mark.e2e
def test_a_pause_every_stream_shares_is_the_servers_not_a_stall():
    # An engine without chunked prefill or prefix cache: each refill's 1,000-token prefill
    # (1.5 ms a token: 1.5 s) blocks the other stream's decode for longer than the 1 s
    # stall minimum. That pause is the server's rate, not a stalled stream: with the pause
    # cap (what a sweep sets) nothing is cut and the tokens of the pause count. Without it
    # (cap 0) the waiting stream, which has had only its first token, used to be cut as a
    # stall again and again; it is now judged by its own pace (twice its first token's
    # wait, itself a 1.5 s prefill), so it is not cut either. (The cap alone is
    # table-tested: test_scheduler.cpp StallRule.ASilenceEveryStreamShares...)
    profile = {
        "prefix_cache": False,
        "chunk_tokens": 1_000_000,
        "prefill_per_token_us": 1500.0,
        "context_length": 4096,
        "kv_tokens": 65536,
    }
    model = {"model": "sim-batch"}
    bodies = [
        json.dumps({**json.loads(b), **model}).encode() for b in _seed_bodies(2, 1000, 40, 500)
    ]
    stalls = {}
    with Sim("test-batch", overrides=profile) as sim:
        for cap_s in (0.0, 8.0):
            spec = _spec(sim.url + "/v1/completions", 2, 5.0, b"", stall_min_s=1.0)
            spec.bodies = bodies
            spec.stall_pause_cap_s = cap_s
            res = _core.CellRunner(spec).run()
            assert not res.fatal_error
            stalls[cap_s] = res.stalls
            assert sim.wait_idle(timeout_s=10)
    assert stalls == {0.0: 0, 8.0: 0}, stalls  # the old rule cut the waiting stream at cap 0
