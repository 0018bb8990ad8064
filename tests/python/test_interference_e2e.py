"""The prefill-interference cell on the built-in engine (known truth): an engine iteration
is [prefill chunk] then [decode step], so a C-token prefill stretches the decoders' gap from
one step to one step plus the prefill; the cell's inflation must say so."""

from __future__ import annotations

import json

import pytest
from speedmatrix import _core, interference
from speedmatrix.records import Records
from speedmatrix.sim import Sim
from speedmatrix.verdict.interference import interference_cell
from speedmatrix.verdict.names import Status

pytestmark = pytest.mark.e2e

STEP_MS = 20.0
PREFILL_US = 40.0  # per prompt token: a 2048-token prefill takes 82 ms
CONTEXT = 2048


def _body(words: int, max_tokens: int, salt: int) -> bytes:
    prompt = " ".join(f"w{salt}x{i}" for i in range(words))
    return json.dumps(
        {"model": "sim-batch", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    ).encode()


class _Shape:
    id, phase, context, label, repetition = (
        "interference-c2048-n3-r0",
        "interference",
        2048,
        "2K",
        0,
    )
    concurrency = 3
    interference_every_s = 0.5


def test_a_prefill_stretches_the_decoders_gap_by_its_own_length() -> None:
    overrides = {
        "prefill_per_token_us": PREFILL_US,
        "step_base_ms": STEP_MS,
        "step_per_seq_ms": 0.0,
        "step_per_kv_token_ns": 0.0,
        "kv_tokens": 1 << 20,
        "context_length": 1 << 16,
        "chunk_tokens": 4096,
    }
    n, every_s, duration_s = 3, 0.5, 3.0
    prefills = interference.prefill_count(every_s, duration_s)
    assert prefills == 5
    with Sim("test-batch", overrides=overrides) as sim:
        spec = _core.CellSpec()
        spec.url = sim.url + "/v1/completions"
        spec.bodies = [_body(64, 10_000, i) for i in range(n)] + [
            _body(CONTEXT, 1, 100 + k) for k in range(prefills)
        ]
        interference.configure(spec, n, every_s, duration_s)
        res = _core.CellRunner(spec).run()
    assert res.fatal_error == ""
    cell = interference_cell(_Shape(), Records.from_result(res), idle=True)
    assert cell["status"] == Status.VALID.value, cell.get("reason")
    assert cell["interference_prefills"] == prefills
    prefill_ms = CONTEXT * PREFILL_US / 1000
    # a clear gap is one step; one gap per prefill carries the prefill too; a loaded
    # machine adds its scheduling to the p99s (up to 30 ms with seven engineers' builds running)
    assert STEP_MS <= cell["tbt_clear_p99_ms"] <= STEP_MS + 30
    assert prefill_ms + STEP_MS <= cell["tbt_overlap_p99_ms"] <= prefill_ms + STEP_MS + 60
    truth = (prefill_ms + STEP_MS) / STEP_MS  # 5.1
    assert 0.4 * truth <= cell["tbt_inflation"] <= 1.1 * truth
    assert cell["gaps_over_100ms"] >= prefills - 1  # 102 ms stalls, one per prefill
