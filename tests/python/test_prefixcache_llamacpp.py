"""The prefix-cache axis on a real engine: llama.cpp with one slot reports the cached
prompt tokens in usage and in its timings (cache_n), and both give the asked fraction."""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path

import pytest
from speedmatrix.prefixcache import delivered, shared_prefix_tokens
from speedmatrix.prompts import WORDS
from test_llamacpp import LlamaServer, _binary
from tiny_gguf import write_tiny_model

pytestmark = [pytest.mark.llamacpp, pytest.mark.e2e]

CONTEXT = 512


def _complete(url: str, ids: list[int]) -> dict:
    body = {"prompt": ids, "max_tokens": 1, "cache_prompt": True}
    req = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_llamacpp_delivers_the_asked_cached_fraction(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf", 4096, words=WORDS)
    server = LlamaServer(_binary(), model, ["--parallel", "1", "-c", "4096"], tmp_path / "l.log")
    try:
        for fraction in (0.0, 0.5, 0.9):
            rng = random.Random(f"cell {fraction}")
            shared = shared_prefix_tokens(CONTEXT, fraction)
            prefix = [rng.randrange(10, 150) for _ in range(shared)]
            if shared:
                _complete(server.url, prefix)  # the warm-up
            prompts, cached, prompt_n, cache_n = [], [], [], []
            for _ in range(3):
                tail = [rng.randrange(10, 150) for _ in range(CONTEXT - shared)]
                reply = _complete(server.url, prefix + tail)
                usage, timings = reply["usage"], reply["timings"]
                prompts.append(usage["prompt_tokens"])
                cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
                prompt_n.append(timings["prompt_n"])
                cache_n.append(timings["cache_n"])
            assert prompts == [CONTEXT] * 3
            rate, source = delivered(prompts, cached)
            assert source == "usage" and rate is not None
            assert abs(rate - fraction) <= 0.02, (fraction, rate)
            assert delivered(prompts, [None] * 3, timings=(prompt_n, cache_n)) == (
                pytest.approx(rate),
                "timings",
            )
    finally:
        server.stop()
