"""End to end: the built-in engine's injected faults reach speedmatrix's own client
(the sweep and its C++ cell runner) as the error kinds of records.hpp, are counted
in the cell's errors, and the run is still written.

tests/python/test_sim.py checks the same faults on the wire with a raw socket; here
the question is what a user of speedmatrix sees in run.json.
"""

from __future__ import annotations

import json
import socket

import pytest
from speedmatrix import runfile
from speedmatrix.adapters import discover
from speedmatrix.matrix import Matrix
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep

# End-to-end tier: the built-in engine in real time, with faults.
pytestmark = pytest.mark.e2e

CELL = "decode-c64-n2-r0"

# The fault the engine injects -> the error kind the client must record.
# A drop is a connection closed in the middle of the chunked body: libcurl ends the
# transfer with "transfer closed with outstanding read data remaining", which the
# client files as a broken connection, not as a stream that ended cleanly too early.
# no_done: the body ends cleanly after 3 tokens, with neither a finish reason nor
# [DONE]; error_event: an {"error": ...} event after 3 tokens (then [DONE]); not_sse: a
# 200 answer with an HTML body.
KINDS = {
    "http_500": "http_500",
    "malformed": "malformed_event",
    "drop": "connection_reset",
    "stall": "stall",
    "no_done": "incomplete_stream",
    "error_event": "stream_error",
    "not_sse": "not_sse",
}
# The faults that fire before any token was sent.
NO_TOKENS = {"http_500", "not_sse"}
# What the client keeps of each failure in the cell's error_examples: the server's own
# words (from the JSON error body, the error event, the start of a non-SSE body).
MESSAGES = {
    "http_500": "simulated internal server error",
    "malformed": '{"id":"broken"',
    "drop": "transfer closed",
    "stall": "idle timeout",
    "no_done": "without [DONE]",
    "error_event": "simulated engine error mid-stream",
    "not_sse": "this is not an event stream",
}


def _sweep(url: str, matrix: Matrix, out, **kw) -> tuple[int, dict]:
    code = Sweep(url, matrix, out, progress=False, report=False, **kw).execute()
    doc = json.loads((out / "run.json").read_text())
    return code, {c["id"]: c for c in doc["cells"]}


def _matrix(**kw) -> Matrix:
    # No warm-up and no prefill cell: every request of the cell is a window request,
    # so every fault lands in the cell's error count. A short window: at 50 ms TTFT and
    # 20 ms per token a 10-token request takes about 0.25 s.
    args = {
        "contexts": [64],
        "concurrency": [2],
        "duration_s": 1.5,
        "max_output": 10,
        "prefill_contexts": [],
        "warmup": False,
    }
    return Matrix(**{**args, **kw})


@pytest.fixture(scope="module")
def sim():
    with Sim("test-fast") as s:
        yield s


@pytest.mark.parametrize("fault", list(KINDS))
def test_each_fault_reaches_the_client_as_its_error_kind(sim, tmp_path, fault):
    # "sm_fault" in the body makes every request of the cell fail the same way; the
    # prompt-calibration requests discovery sends do not carry it.
    m = _matrix(
        extra={"sm_fault": fault},
        # A stalled stream is cut after 0.3 s of silence, well inside the window
        # (a stream still open at the window's end is cancelled, not an error).
        request_idle_timeout_s=0.3,
    )
    code, cells = _sweep(sim.url, m, tmp_path)
    assert code == 0
    c = cells[CELL]
    kind = KINDS[fault]
    # Only this kind, counted once per failed request, and it makes the cell an error.
    assert set(c["errors"]) == {kind}, c["errors"]
    assert c["errors"][kind] == c["errors_total"] >= 2
    assert c["status"] == "error" and kind in c["reason"]
    assert MESSAGES[fault] in c["error_examples"][kind], c["error_examples"]
    # The closed loop kept refilling: more requests failed than the 2 slots.
    if fault == "stall":
        assert c["errors_total"] >= 4  # about 0.4 s each in a 1.5 s window
    # The run on disk holds the cell and its raw records, each failed request with its kind.
    rec = runfile.load_records(tmp_path, c["records"])
    req = rec["requests"]
    window = req["phase"] == 1
    failed = [k for k, o in zip(req["error_kind"][window], req["outcome"][window]) if o == 3]
    assert len(failed) == c["errors_total"] and set(failed) == {kind}
    # A fault that hits after some tokens still delivered them: 3 tokens, then the fault.
    if fault in NO_TOKENS:
        assert c["output_tokens"] == 0
    else:
        assert c["output_tokens"] > 0
    # The engine was left idle: every faulty request was freed.
    assert sim.wait_idle(timeout_s=5)


def test_fault_shares_from_the_engine_flags_are_counted_by_kind(tmp_path):
    # The engine's own random share (no request asks for a fault): some requests
    # fail, each as its kind, the others stream to the end.
    with Sim("test-fast", faults={"http500": 0.2, "malformed": 0.2}, seed=11) as s:
        code, cells = _sweep(s.url, _matrix(concurrency=[4]), tmp_path)
    c = cells["decode-c64-n4-r0"]
    assert code == 0
    assert set(c["errors"]) == {"http_500", "malformed_event"}, c["errors"]
    assert c["errors_total"] == sum(c["errors"].values())
    assert c["completed"] > 0 and c["output_tokens"] > 0
    assert c["status"] == "error"  # 40% failed, far over the 5% threshold


def test_a_rate_limited_cell_waits_the_retry_after_and_says_so(sim, tmp_path):
    # Every request of the cell is answered 429 with "Retry-After: 1": each of the 2
    # slots sends about once a second (not every 50 ms), the waits are in the cell, and
    # the reader is told the server rate-limited it.
    code, cells = _sweep(sim.url, _matrix(extra={"sm_fault": "http_429"}), tmp_path)
    assert code == 0  # a 429 is an answer: the server is not lost
    c = cells[CELL]
    _only_errors(c, "http_429", tmp_path)
    assert "simulated rate limit" in c["error_examples"]["http_429"]
    assert "Retry-After 1000 ms" in c["error_examples"]["http_429"]
    assert c["errors_total"] <= 2 * (1.5 + 1)  # N x (D / Retry-After + 1)
    assert "rate_limited" in c["flags"]
    assert c["backoffs"] >= 2 and 1.0 <= c["backoff_s"] <= 2 * 1.5
    assert sim.wait_idle(timeout_s=5)


def _only_errors(c: dict, kind: str, out) -> None:
    """Every window request of the cell failed as `kind`, and run.json holds its records."""
    assert set(c["errors"]) == {kind}, c["errors"]
    assert c["errors"][kind] == c["errors_total"] >= 2
    assert c["status"] == "error" and kind in c["reason"]
    assert c["output_tokens"] == 0
    req = runfile.load_records(out, c["records"])["requests"]
    window = req["phase"] == 1
    assert set(req["outcome"][window]) == {3}
    assert set(req["error_kind"][window]) == {kind}


def test_a_prompt_longer_than_the_context_is_http_400(sim, tmp_path):
    # The user gives a context length the engine does not have (test-fast: 4096), so the
    # plan lets a 6000-token cell through and the engine answers each request 400: a
    # refusal for lack of context, which is the over-capacity verdict in the server's
    # words (issue 21, speedmatrix.verdict.refusal), its failures counted as errors.
    m = _matrix(contexts=[6000])
    code, cells = _sweep(sim.url, m, tmp_path, overrides={"context_length": 131072})
    assert code in (0, 3)  # a 4xx is an answer: the server is not lost
    c = cells["decode-c6000-n2-r0"]
    assert set(c["errors"]) == {"http_400"} and c["errors"]["http_400"] >= 2
    assert "maximum context length is 4096" in c["error_examples"]["http_400"]
    assert c["status"] == "over_capacity", c.get("reason")
    assert "maximum context length is 4096" in c["reason"]
    assert sim.wait_idle(timeout_s=5)


def test_a_closed_port_is_a_connect_error_per_request(sim, tmp_path):
    # Discovery, prompts and the lost-server probe go to the engine; only the cell's
    # streams go to a port where nothing listens (bound, never listening: refused).
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        target = discover(sim.url)
        target.endpoint = lambda api: f"http://127.0.0.1:{port}/v1/completions"
        code, cells = _sweep(sim.url, _matrix(), tmp_path, target=target)
    assert code == 0  # the server still answers /v1/models: the run is not cut short
    c = cells[CELL]
    _only_errors(c, "connect", tmp_path)
    assert f"port {port}" in c["error_examples"]["connect"]
