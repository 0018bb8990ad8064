"""The capacity model of each engine family (capacity.py), as tables: (C, N, O) -> verdict."""

import numpy as np
import pytest
from speedmatrix.adapters import Target
from speedmatrix.capacity import CapacityModel, model_for
from speedmatrix.matrix import Matrix
from speedmatrix.plan import plan


def target(engine: str, info: dict | None = None, **capacity) -> Target:
    t = Target("http://h:1", engine=engine, model="m")
    for name, value in capacity.items():
        t.set_capacity(name, value, "probed", f"{engine} fact")
    t.info.update(info or {})
    return t


# (context, concurrency, max output) -> status, queued
SHARED_POOL = [  # SGLang: pool 16384 tokens, 4 running at once
    ((1024, 1, 64), None, False),
    ((1024, 15, 64), None, True),  # min(15, 4) × 1088 = 4352 fits; N above 4 queues
    ((4096, 4, 64), "over_capacity", False),  # 4 × 4160 = 16640 > 16384
    ((4096, 8, 64), "over_capacity", True),
    ((16000, 1, 384), None, False),  # 16384 exactly fits
    ((16000, 1, 385), "over_capacity", False),
]
PER_SLOT = [  # llama.cpp --parallel 4 -c 8192: four 2048-token slot caches
    ((1024, 1, 64), None, False),
    ((1024, 4, 64), None, False),
    ((1024, 8, 64), None, True),  # the "1K × 8": queued, never over capacity
    ((1984, 8, 64), None, True),  # 2048 exactly fits a slot
    ((1985, 1, 64), "over_capacity", False),  # larger than a slot: refused whatever N
]
UNIFIED = [  # llama.cpp default: 4 slots over one unified pool of 4096 tokens
    ((256, 1, 64), None, False),
    ((256, 8, 64), None, True),  # min(8, 4) × 320 = 1280 fits
    ((1024, 2, 64), None, False),  # 2 × 1088 = 2176
    ((1024, 4, 64), "over_capacity", False),  # 4 × 1088 = 4352 > 4096
    ((1024, 5, 64), "over_capacity", True),  # min(5, 4) × 1088 still too much
    ((960, 8, 64), None, True),  # 4 × 1024 = 4096 exactly fits
    ((4000, 1, 96), None, False),
    ((4000, 1, 97), "over_capacity", False),
]
TOKENS_IN_FLIGHT = [  # TGI: max_total_tokens 4096 per request, batch 8, no pool exposed
    ((1024, 64, 64), None, True),
    ((4032, 8, 64), None, False),
    ((4033, 1, 64), "over_capacity", False),
]


@pytest.mark.parametrize(
    ("model", "table"),
    [
        (model_for(target("sglang", kv_tokens=16384, max_running=4)), SHARED_POOL),
        (
            model_for(
                target(
                    "llamacpp",
                    {"kv_layout": {"unified": False, "source": "t"}},
                    context_length=2048,
                    max_running=4,
                )
            ),
            PER_SLOT,
        ),
        (
            model_for(
                target(
                    "llamacpp",
                    {"kv_layout": {"unified": True, "source": "t"}},
                    context_length=4096,
                    max_running=4,
                )
            ),
            UNIFIED,
        ),
        (model_for(target("tgi", context_length=4096, max_running=8)), TOKENS_IN_FLIGHT),
    ],
    ids=["shared_pool", "per_slot", "unified_slots", "tokens_in_flight"],
)
def test_family_tables(model: CapacityModel, table):
    for (c, n, o), status, queued in table:
        fit = model.check(c, n, o)
        assert (fit.status, fit.queued) == (status, queued), (model.family, c, n, o, fit)
        assert bool(fit.reason) == bool(status)


def test_families_chosen_per_engine():
    assert model_for(target("vllm", kv_tokens=1000)).family == "shared_pool"
    assert model_for(target("vllm")).family == "unknown"
    assert model_for(target("ollama", context_length=2048)).family == "tokens_in_flight"
    unified = target("llamacpp", {"kv_layout": {"unified": True}}, context_length=16384)
    assert model_for(unified).family == "unified_slots"
    assert model_for(unified).pool_tokens == 16384  # not 4 × 16384: the bug
    split = target("llamacpp", {"kv_layout": {"unified": False}}, context_length=2048)
    assert model_for(split).family == "per_slot"


def test_llamacpp_layout_unknown_claims_no_pool_and_says_so():
    # split slots would hold 4 × 2048, a unified pool 2048: no pool is claimed, only the
    # slot rule, and the server's refusal judges the rest (issue 21: `-np 2 -c 12288
    # --kv-unified` taken for split slots planned a pool it did not have)
    m = model_for(target("llamacpp", context_length=2048, max_running=4))
    assert m.family == "per_slot" and m.pool_tokens is None and m.slot_tokens == 2048
    assert m.check(1024, 2, 64).status is None
    assert m.check(2048, 1, 64).status == "over_capacity"
    assert "did not say" in m.note
    # a given pool settles the layout: smaller than the slots together = shared
    g = model_for(target("llamacpp", context_length=2048, max_running=4), kv_tokens=4096)
    assert g.family == "unified_slots" and g.pool_tokens == 4096
    assert g.sources["pool_tokens"] == "given"
    g = model_for(target("llamacpp", context_length=2048, max_running=4), kv_tokens=8192)
    assert g.family == "per_slot" and g.slot_tokens == 2048


def test_reasons_state_the_rule_and_values():
    u = CapacityModel("unified_slots", pool_tokens=4096, slots=4)
    assert u.check(1024, 8, 64).reason == (
        "min(8, slots 4) × (1024 + 64) = 4,352 tokens > unified KV pool 4,096 tokens"
    )
    s = CapacityModel("per_slot", slot_tokens=2048, slots=4)
    assert s.check(2048, 1, 64).reason == (
        "2048 + 64 = 2,112 tokens > the slot's KV cache 2,048 tokens "
        "(refused whatever the concurrency)"
    )


def test_plan_uses_the_family_rule_and_records_it():
    m = Matrix(contexts=[1024], concurrency=[1, 4, 8], max_output=64)
    split = target(
        "llamacpp", {"kv_layout": {"unified": False}}, context_length=2048, max_running=4
    )
    p = plan(m, split)
    assert [c.status for c in p] == [None, None, None]
    assert [c.expect_queued for c in p] == [False, False, True]
    assert p.capacity_model["family"] == "per_slot"
    assert p.capacity_model["slot_tokens"] == 2048
    assert p.capacity_model["sources"]["slot_tokens"] == "probed: llamacpp fact"
    unified = target(
        "llamacpp", {"kv_layout": {"unified": True}}, context_length=4096, max_running=4
    )
    p = plan(m, unified)
    assert [c.status for c in p] == [None, "over_capacity", "over_capacity"]
    assert p.capacity_model["family"] == "unified_slots"
    assert "rule" in p.capacity_model


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="unknown capacity family"):
        CapacityModel("magic")


# ---- estimated_tokens: only completed requests decide (verdict.tokens_estimated) ----------
# token_source: 1 chunks, 2 usage_final; outcome: 1 ok, 2 cancelled, 3 error
@pytest.mark.parametrize(
    ("sources", "outcomes", "flagged"),
    [
        ([2, 2, 2, 1], [1, 1, 1, 2], False),  # llama.cpp: the cut request has no usage
        ([2, 1, 2], [1, 1, 2], True),  # a completed request without usage
        ([1, 1], [2, 2], True),  # nothing completed: the chunk counts are all there is
        ([2, 2], [1, 1], False),
        ([], [], False),
        ([1, 2], [3, 1], False),  # a failed request's count is not a figure
    ],
)
def test_estimated_tokens_rule(sources, outcomes, flagged):
    from speedmatrix.verdict import tokens_estimated

    assert tokens_estimated(np.array(sources), np.array(outcomes)) is flagged


@pytest.mark.parametrize(
    ("model_id", "shown"),
    [
        ("/home/ci/models/tiny-llama-f32.gguf", "tiny-llama-f32"),
        ("C:\\models\\Qwen2.5-7B-Q4_K_M.gguf", "Qwen2.5-7B-Q4_K_M"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("gpt-oss-20b", "gpt-oss-20b"),
        (None, None),
    ],
)
def test_served_model_of_a_file_path_is_its_stem(model_id, shown):
    from speedmatrix.naming import served_model_name

    assert served_model_name(model_id) == shown
