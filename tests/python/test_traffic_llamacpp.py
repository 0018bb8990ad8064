"""Issue 23's traffic shapes through the sweep on a real engine: llama.cpp (one slot, the
tiny model). The cached-fraction cells deliver the asked share by llama.cpp's own usage
(the record's cached_tokens); the sessions run with exact prompts per turn, each carrying the
previous answer as llama.cpp's /tokenize reads its text (its stream has no ids), and each
turn after the first finds at least the previous turn's prompt in the slot's cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from speedmatrix.matrix import Matrix
from speedmatrix.prompts import WORDS
from speedmatrix.results import load
from speedmatrix.sweep import Sweep
from test_llamacpp import LlamaServer, _binary
from tiny_gguf import write_tiny_model

pytestmark = [pytest.mark.llamacpp, pytest.mark.e2e]

CONTEXT = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama-traffic")
    model = write_tiny_model(tmp / "tiny.gguf", 4096, words=WORDS)
    s = LlamaServer(_binary(), model, ["--parallel", "1", "-c", "4096"], tmp / "l.log")
    yield s
    s.stop()


def _cells(url: str, m: Matrix, out: Path) -> dict:
    assert Sweep(url, m, out, progress=False, report=False).execute() == 0
    return {c["id"]: c for c in json.loads((out / "run.json").read_text())["cells"]}


def test_cached_fraction_cells_deliver_the_asked_share(server, tmp_path: Path) -> None:
    m = Matrix(
        contexts=[CONTEXT],
        concurrency=[1],
        cached_fraction=[0.0, 0.5, 0.9],
        duration_s=3.0,
        max_output=8,
        prefill_contexts=[],
    )
    cells = _cells(server.url, m, tmp_path)
    for f in m.cached_fraction:
        cell = cells[f"decode-c{CONTEXT}-n1-f{f:g}-r0"]
        assert cell["status"] == "valid", cell.get("reason")
        assert cell["delivered_cached_source"] == "usage", cell
        assert abs(cell["delivered_cached_fraction"] - f) <= 0.02, cell
        assert "cache_hit_mismatch" not in cell["flags"]


def test_sessions_find_the_previous_turn_cached(server, tmp_path: Path, capsys) -> None:
    """The answer's ids come from /tokenize of its text. The tiny random model's text need
    not re-tokenize to the ids it generated (its words glue into other tokens), so the slot
    matches the previous prompt and only the answer's head: cached lies between the
    previous prompt and prompt + answer, and the server's own count says where."""
    m = Matrix(
        contexts=[CONTEXT],
        concurrency=[1],
        sessions=3,
        turn_tokens=64,
        max_output=16,
        duration_s=30.0,
        prefill_contexts=[],
    )
    cells = _cells(server.url, m, tmp_path)
    cell = cells[f"session-c{CONTEXT}-n1-t3-r0"]
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["session_answer_source"] == {"tokenize": 3}
    req = load(tmp_path).records(cell["id"]).requests
    prompt = [int(v) for v in req["turn_prompt_tokens"]]
    answer = [int(v) for v in req["answer_tokens"]]
    assert list(req["prompt_tokens"]) == prompt  # exact per turn, as the server counts
    assert prompt[0] == CONTEXT
    for k in (1, 2):
        assert prompt[k] == prompt[k - 1] + answer[k - 1] + 64
    assert cell["session_turn_cached_tokens"] == [0, prompt[0] + answer[0], prompt[1] + answer[1]]
    cached = [int(v) for v in req["cached_tokens"]]  # the slot kept the previous prompt and answer
    for k in (1, 2):
        assert prompt[k - 1] <= cached[k] <= prompt[k - 1] + answer[k - 1], (cached, prompt)
    with capsys.disabled():  # what the re-tokenized answers gave, for the record
        print(
            f"\nllama.cpp sessions: prompts {prompt}, answers generated "
            f"{[int(v) for v in req['output_tokens']]} re-tokenized {answer}, cached {cached}"
        )
