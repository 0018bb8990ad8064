"""The record's new columns on a real engine (issue 23 item 3): llama.cpp's chat stream read
by the core keeps content apart from reasoning (a model that does not think: first content =
first token, no reasoning streamed or reported), its headers come before the first token,
and its usage's ``prompt_tokens_details.cached_tokens`` reaches every record: 0 for the first
prompt, the server's cached prefix for the same prompt sent again to its one slot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from speedmatrix import _core
from speedmatrix.prompts import WORDS
from speedmatrix.reasoning import reasoning_figures
from test_llamacpp import LlamaServer, _binary
from tiny_gguf import write_tiny_model

pytestmark = [pytest.mark.llamacpp, pytest.mark.e2e]

REQUESTS = 4


def test_llamacpp_chat_records_first_content_and_cached_tokens(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf", 4096, words=WORDS)
    server = LlamaServer(_binary(), model, ["--parallel", "1", "-c", "4096"], tmp_path / "l.log")
    prompt = " ".join(WORDS[:200])
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": True,
    }
    try:
        spec = _core.CellSpec()
        spec.url = server.url + "/v1/chat/completions"
        spec.api = _core.ApiKind.chat
        spec.bodies = [json.dumps(body).encode()]
        spec.concurrency = 1  # one slot: each request finds the previous one's prompt cached
        spec.max_requests = REQUESTS
        spec.duration_s = 60.0
        spec.steady_window = False
        res = _core.CellRunner(spec).run()
    finally:
        server.stop()
    assert res.fatal_error == ""
    req = {k: np.asarray(v) if not isinstance(v, list) else v for k, v in res.requests.items()}
    window = np.flatnonzero(req["phase"] == 1)
    assert len(window) == REQUESTS and set(req["outcome"][window].tolist()) == {1}
    first = req["first_token_ns"][window]
    assert np.array_equal(req["first_content_ns"][window], first)
    assert (req["first_byte_ns"][window] <= first).all()
    assert not req["reasoning_deltas"].any() and (req["reasoning_tokens"] == -1).all()
    prompt_tokens = req["prompt_tokens"][window]
    cached = req["cached_tokens"][window]
    assert cached[0] == 0 and (cached >= 0).all(), cached  # the server said, for every request
    # the same prompt again on the one slot: all but the last prompt token come from its cache
    assert (cached[1:] > 0.9 * prompt_tokens[1:]).all() and (cached < prompt_tokens).all()
    fig = reasoning_figures(req, int(req["sent_ns"][window[0]]), int(res.window_end_ns))
    assert fig["reasoning_tokens"] is None and fig["reasoning_share"] is None
    assert fig["ttfb_ms"] is not None and fig["ttfo_ms"] is not None
    assert fig["ttfb_ms"] <= fig["ttfo_ms"]
