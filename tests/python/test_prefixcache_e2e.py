"""The prefix-cache axis on the built-in engine (known truth): prompts that share a cell's
fraction of their tokens with a warm-up prompt are served with that fraction cached
(usage cached_tokens, and the engine's counters agree), and their time to first token
falls as the engine's prefill model says."""

from __future__ import annotations

import json
import random
import time
import urllib.request

import pytest
from speedmatrix.prefixcache import (
    delivered_from_counters,
    delivered_from_usage,
    prefix_seed,
    shared_prefix_tokens,
)
from speedmatrix.sim import Sim
from speedmatrix.verdict.cache import cache_hit_mismatch

pytestmark = pytest.mark.e2e

CONTEXT = 1024
PREFILL_US = 300.0  # per uncached prompt token: a cold 1024-token prompt takes 307 ms
VOCAB = 30000


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, VOCAB) for _ in range(n)]


def _complete(url: str, ids: list[int]) -> tuple[dict, float]:
    body = json.dumps({"model": "sim-batch", "prompt": ids, "max_tokens": 1}).encode()
    req = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as resp:
        usage = json.loads(resp.read())["usage"]
    return usage, time.monotonic() - t0


def _counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:prefix_cache_"):
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            out[name] = out.get(name, 0.0) + value
    return out


def _cell(url: str, fraction: float, requests: int = 4) -> tuple[float, float | None, float]:
    """One cell: warm the shared prefix, then send requests one at a time; returns the
    delivered fraction from usage, from the counters, and the median response time."""
    shared = shared_prefix_tokens(CONTEXT, fraction)
    seed = prefix_seed(1, f"C={CONTEXT} f={fraction}")
    prefix = _ids(seed, shared)
    if shared:
        _complete(url, prefix)  # the warm-up: the server now holds the prefix
    before = _counters(url)
    prompts, cached, times = [], [], []
    for i in range(requests):
        usage, took_s = _complete(url, prefix + _ids(seed + 1 + i, CONTEXT - shared))
        assert usage["prompt_tokens"] == CONTEXT  # exact lengths, as every cell
        prompts.append(usage["prompt_tokens"])
        cached.append(usage.get("prompt_tokens_details", {}).get("cached_tokens"))
        times.append(took_s)
    from_usage = delivered_from_usage(prompts, cached)
    return (
        0.0 if from_usage is None else from_usage,
        delivered_from_counters(before, _counters(url)),
        sorted(times)[len(times) // 2],
    )


def test_requested_equals_delivered_and_ttft_falls_with_the_cached_fraction() -> None:
    overrides = {
        "prefill_per_token_us": PREFILL_US,
        "step_base_ms": 1.0,
        "step_per_seq_ms": 0.0,
        "step_per_kv_token_ns": 0.0,
        "kv_tokens": 65536,
        "vocab_size": VOCAB,
    }
    with Sim("test-batch", flavour="vllm", overrides=overrides) as sim:
        cells = {f: _cell(sim.url, f) for f in (0.0, 0.5, 0.9)}
    for fraction, (usage_rate, counter_rate, _) in cells.items():
        # the engine caches whole 16-token blocks: within 2 points of the asked fraction
        assert abs(usage_rate - fraction) <= 0.02, (fraction, usage_rate)
        assert counter_rate == pytest.approx(usage_rate)
        assert not cache_hit_mismatch(fraction, usage_rate)
    for fraction, (rate, _, took_s) in cells.items():
        model_s = CONTEXT * (1 - rate) * PREFILL_US * 1e-6
        # the model's prefill plus at most 60 ms of HTTP and scheduling on a loaded machine
        assert model_s <= took_s <= model_s + 0.06, (fraction, took_s, model_s)
    assert cells[0.0][2] > cells[0.5][2] > cells[0.9][2]
