"""Sessions with the server's real answers on the built-in engine (known truth): the engine
keeps the blocks of what it generated, so each turn's cached tokens, as the engine reports
them, are exactly the previous turn's prompt + answer, whether the answer's ids came from
the stream (vllm flavour, return_token_ids) or from the engine's tokenize endpoint (sglang
flavour: no ids in its stream)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from speedmatrix._native import _core
from speedmatrix.matrix import Matrix
from speedmatrix.recompute import recompute_doc
from speedmatrix.results import load
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep

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
