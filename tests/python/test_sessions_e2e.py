"""Sessions with the server's real answers on the built-in engine (known truth): the engine
keeps the blocks of what it generated, so each turn's cached tokens, as the engine reports
them, are exactly the previous turn's prompt + answer, whether the answer's ids came from
the stream (vllm flavour, return_token_ids) or from the engine's tokenize endpoint (sglang
flavour: no ids in its stream). And sessions run free: with unequal answers, a session's
next turn goes out at its own answer's end + the think time, not with the slowest, and
later turns are not a burst of N prefills (against the old lock step, emulated)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from speedmatrix import sessions
from speedmatrix._native import _core
from speedmatrix.matrix import Matrix
from speedmatrix.recompute import recompute_doc
from speedmatrix.results import load
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep
from speedmatrix.verdict.sessions import send_late_p99_ms

pytestmark = pytest.mark.e2e

OVERRIDES = {
    "prefill_per_token_us": 50.0,
    "step_base_ms": 2.0,
    "kv_tokens": 65536,
    "context_length": 1 << 16,
}


@pytest.mark.parametrize("flavour, source", [("vllm", "stream"), ("sglang", "tokenize")])
def test_each_turn_finds_the_previous_prompt_and_answer_cached(
    tmp_path: Path, flavour: str, source: str
) -> None:
    m = Matrix(
        contexts=[512],
        concurrency=[2],
        sessions=3,
        turn_tokens=80,
        max_output=16,
        duration_s=20.0,
        prefill_contexts=[],
    )
    with Sim("test-batch", flavour=flavour, overrides=OVERRIDES) as sim:
        assert Sweep(sim.url, m, tmp_path, progress=False, report=False).execute() == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    (cell,) = doc["cells"]
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["session_answer_source"] == {source: 6}
    assert cell["session_answer_reason"] == ""
    # 512 + 16 and 608 + 16: the engine caches whole 16-token blocks, all of it here
    assert cell["session_turn_prompt_tokens"] == [512, 608, 704]
    assert cell["session_turn_cached_tokens"] == [0, 528, 624]
    assert cell["session_turn_delivered_cached_tokens"][1:] == [528, 624]
    req = load(tmp_path).records(cell["id"]).requests
    for s in range(2):
        mine = req["session"] == s
        turn = req["turn"][mine]
        order = np.argsort(turn)
        prompt = req["turn_prompt_tokens"][mine][order]
        answer = req["answer_tokens"][mine][order]
        cached = req["cached_tokens"][mine][order]
        # per request: what the engine served from its cache = the previous prompt + answer
        assert list(cached[1:]) == list(prompt[:-1] + answer[:-1])
        # and the server counted the prompt the client built
        assert list(req["prompt_tokens"][mine][order]) == list(prompt)
    assert recompute_doc(doc, tmp_path).changed == []


@pytest.mark.parametrize("threads", [1, 2])
def test_kept_outputs_follow_their_requests_across_event_loops(threads: int) -> None:
    """CellSpec.keep_output: outputs[i] is request i's, also when two event loops ran the
    cell and their records were merged; bodies of distinct lengths tell them apart."""
    with Sim("test-batch", flavour="vllm", overrides=OVERRIDES) as sim:
        model = sim.get_json("/v1/models")["data"][0]["id"]
        spec = _core.CellSpec()
        spec.url = sim.url + "/v1/completions"
        spec.bodies = [
            json.dumps(
                {
                    "model": model,
                    "prompt": list(range(1, 40)),
                    "max_tokens": n,
                    "ignore_eos": True,
                    "stream": True,
                    "return_token_ids": True,
                }
            )
            for n in (3, 5, 7, 9)
        ]
        spec.concurrency = 4
        spec.max_requests = 12
        spec.duration_s = 20.0
        spec.steady_window = False
        spec.client_threads = threads
        spec.keep_output = True
        res = _core.CellRunner(spec).run()
        assert res.fatal_error == ""
        req = res.requests
        assert len(res.outputs) == len(req["body"]) >= 12
        for i, out in enumerate(res.outputs):
            if req["outcome"][i] != 1:
                continue
            n = (3, 5, 7, 9)[req["body"][i]]
            assert out.token_ids is not None and len(out.token_ids) == n
            assert len(out.text.split()) == n and not out.truncated
        # off: nothing kept
        spec.keep_output = False
        assert _core.CellRunner(spec).run().outputs == []


THINK_S, N, TURNS, CONTEXT = 0.05, 8, 2, 512
#: session s answers this many tokens: unequal, as real answers are
ANSWERS = [16 + s * 112 // (N - 1) for s in range(N)]


def _free_or_lockstep(free: bool) -> dict:
    """One sessions cell on a fresh built-in engine (seed-h200), its records."""
    last = sessions.final_tokens(CONTEXT, 64, max(ANSWERS), TURNS)
    pools = [[1000 + (s * 7919 + i * 31) % 50000 for i in range(last)] for s in range(N)]
    chat = sessions.Chat(pools, CONTEXT, 0, max(ANSWERS), 64, TURNS)
    with Sim("seed-h200", flavour="vllm", overrides={"context_length": 1 << 16}) as sim:
        model = sim.get_json("/v1/models")["data"][0]["id"]

        def body_of(s: int, ids: list[int]) -> bytes:
            body = {"model": model, "prompt": ids, "max_tokens": ANSWERS[s], "stream": True}
            return json.dumps({**body, "ignore_eos": True, "return_token_ids": True}).encode()

        spec = _core.CellSpec()
        spec.url = sim.url + "/v1/completions"
        spec.bodies = [body_of(s, ids) for s, ids in enumerate(chat.prompts)]
        spec.concurrency = N
        spec.duration_s = 60.0
        spec.steady_window = False
        spec.keep_output = True
        spec.chain = feed = _core.ChainFeed(N, TURNS, THINK_S)
        feeder = threading.Thread(
            target=sessions.run_feeder if free else sessions.run_lockstep_feeder,
            args=(feed, chat, body_of, {}) if free else (feed, chat, body_of, {}, THINK_S),
        )
        feeder.start()
        res = _core.CellRunner(spec).run()
        feeder.join()
    assert res.fatal_error == "" and res.stopped_by == "requests"
    req = dict(res.requests)
    req.update(sessions.turn_columns(req["body"], chat, feed.ready_ns()))
    assert list(req["outcome"]) == [1] * (N * TURNS)
    return req


def test_free_sessions_do_not_wait_for_the_slowest_nor_burst_their_later_turns() -> None:
    free, lock = _free_or_lockstep(True), _free_or_lockstep(False)
    by_body = {int(b): i for i, b in enumerate(free["body"])}
    sent, done, due = free["sent_ns"], free["done_ns"], free["scheduled_ns"]
    for s in range(N):
        i, j = by_body[s], by_body[N + s]  # turn 0, turn 1 of session s
        # due at its own answer's end + the think time, and sent then (woken, not polled)
        assert due[j] == done[i] + int(THINK_S * 1e9)
        assert 0 <= sent[j] - due[j] < 25_000_000, s
        assert free["body_ready_ns"][j] <= sent[j]
    # not aligned to the slowest: the shortest session's turn 1 went out long before the
    # longest session's turn 0 ended (in lock step, only after it)
    assert sent[by_body[N]] + 500_000_000 < done[by_body[N - 1]]
    lock_by = {int(b): i for i, b in enumerate(lock["body"])}
    assert lock["sent_ns"][lock_by[N]] > lock["done_ns"][lock_by[N - 1]]

    # later-turn TTFT without the burst of N prefills: well below lock step's
    def later_ttft_ms(req: dict) -> float:
        later = req["turn"] >= 1
        return float(np.median(req["first_token_ns"][later] - req["sent_ns"][later]) / 1e6)

    assert later_ttft_ms(free) < 0.8 * later_ttft_ms(lock), (
        later_ttft_ms(free),
        later_ttft_ms(lock),
    )
    # the feeder kept up: the figure the verdict reads, far under the sessions_late rule
    turn = np.asarray(free["turn"])
    assert send_late_p99_ms(free, np.arange(len(turn)), turn) < 25.0
