import pytest
from seed import seed_over_capacity
from speedmatrix.adapters import Target
from speedmatrix.matrix import Matrix
from speedmatrix.plan import decode_max, plan, prefill_max

SEED_KV = 1_441_792
SEED_CTX = 131072
K = 1024


def seed_target(**capacity) -> Target:
    t = Target("http://h:1", engine="sglang", model="muse-glimmer")
    values = {"kv_tokens": SEED_KV, "context_length": SEED_CTX, "max_running": None}
    values.update(capacity)
    for name, value in values.items():
        t.set_capacity(name, value, "probed")
    return t


# the seed report's "Over capacity" cells, by label, read from the report itself
SEED_OVER = seed_over_capacity()


def test_seed_over_capacity_set_is_the_seeds():
    p = plan(Matrix.preset("seed"), seed_target())
    decode = [c for c in p if c.phase == "decode"]
    assert len(decode) == 5 * 8
    over = {(c.label, c.concurrency) for c in decode if c.status == "over_capacity"}
    assert over == SEED_OVER
    assert all(c.status is None for c in decode if (c.label, c.concurrency) not in SEED_OVER)
    assert p.warnings == []


def test_seed_contexts_and_labels():
    p = plan(Matrix.preset("seed"), seed_target())
    assert p.contexts == [8 * K, 16 * K, 32 * K, 64 * K, 125952]
    assert p.prefill_contexts == [8 * K, 16 * K, 32 * K, 64 * K, 125952, 131008]
    prefill = [c for c in p if c.phase == "prefill"]
    assert [c.label for c in prefill] == ["8K", "16K", "32K", "64K", "123K", "128K"]
    assert all(c.status is None and c.concurrency == 1 for c in prefill)
    assert [c.spec for c in prefill][-2:] == ["max-decode", "max"]


def test_order_and_ids():
    p = plan(Matrix.preset("seed"), seed_target())
    phases = [c.phase for c in p]
    assert phases == ["prefill"] * 6 + ["decode"] * 40
    assert p[0].id == "prefill-c8192-r0"
    assert p[6].id == "decode-c8192-n1-r0"
    assert p[7].id == "decode-c8192-n2-r0"
    assert p[-1].id == "decode-c125952-n128-r0"
    assert len({c.id for c in p}) == len(p)


def test_over_capacity_reason_states_the_rule():
    cell = plan(Matrix.preset("seed"), seed_target()).by_id()["decode-c8192-n128-r0"]
    assert cell.status == "over_capacity"
    assert cell.reason == "128 × (8192 + 4096) = 1,572,864 tokens > KV capacity 1,441,792 tokens"
    assert cell.kv_needed == 1_572_864


@pytest.mark.parametrize(
    "context_length, max_output, want",
    [
        (131072, 4096, 125952),  # the seed's 123K
        (32768, 4096, 27648),
        (8192, 1024, 6656),  # 8192 - 1024 - 512 = 6656, multiple of 64
        (4096, 256, 3584),
        (1024, 1024, 0),
    ],
)
def test_decode_max(context_length, max_output, want):
    assert decode_max(context_length, max_output) == want


@pytest.mark.parametrize(
    "context_length, want", [(131072, 131008), (32768, 32704), (100, 0), (130, 64)]
)
def test_prefill_max(context_length, want):
    assert prefill_max(context_length) == want


def test_contexts_beyond_the_context_length_are_error_cells():
    m = Matrix(contexts=[8 * K, 200 * K], concurrency=[1, 2], prefill_contexts=[128 * K, "max"])
    p = plan(m, seed_target())
    by_id = p.by_id()
    big = by_id["decode-c204800-n1-r0"]
    assert big.status == "error"
    assert "exceeds the server's context length 131072" in big.reason
    # 128K exactly + 1 output token does not fit either
    assert by_id["prefill-c131072-r0"].status == "error"
    assert by_id["prefill-c131008-r0"].status is None
    assert by_id["decode-c8192-n2-r0"].status is None


def test_unknown_kv_capacity_marks_nothing_and_warns():
    p = plan(Matrix.preset("seed"), seed_target(kv_tokens=None))
    assert not [c for c in p if c.status == "over_capacity"]
    assert any("KV capacity unknown" in w for w in p.warnings)


def test_unknown_context_length_makes_max_cells_errors():
    p = plan(Matrix.preset("seed"), seed_target(context_length=None))
    max_cells = [c for c in p if c.spec in ("max", "max-decode")]
    assert max_cells and all(c.status == "error" for c in max_cells)
    assert "give --context-length" in max_cells[0].reason
    assert max_cells[0].id == "prefill-max-decode-r0"
    assert any("context length unknown" in w for w in p.warnings)
    # the numeric cells are still planned normally
    assert p.by_id()["decode-c8192-n128-r0"].status == "over_capacity"


def test_keyword_overrides_replace_the_targets_figures():
    p = plan(Matrix.preset("seed"), seed_target(), kv_tokens=2 * SEED_KV)
    assert ("8K", 128) not in {(c.label, c.concurrency) for c in p if c.status}
    p = plan(Matrix.preset("seed"), None, kv_tokens=SEED_KV, context_length=SEED_CTX)
    assert {(c.label, c.concurrency) for c in p if c.status == "over_capacity"} == SEED_OVER


def test_running_cap_marks_expected_queueing():
    m = Matrix(contexts=[1024], concurrency=[2, 4, 8], max_output=64)
    p = plan(m, seed_target(max_running=4))
    assert [c.expect_queued for c in p] == [False, False, True]


def test_repetitions_and_duplicate_contexts():
    m = Matrix(
        contexts=[125952, "max"], concurrency=[1], repetitions=2, prefill_contexts=["max-decode"]
    )
    p = plan(m, seed_target())
    assert [c.id for c in p] == [
        "prefill-c125952-r0",
        "prefill-c125952-r1",
        "decode-c125952-n1-r0",
        "decode-c125952-n1-r1",
    ]
    assert any("'max' resolves to 125952 tokens, the same as 125952" in w for w in p.warnings)


def test_invalid_matrix_is_refused():
    with pytest.raises(ValueError, match="concurrency: 0"):
        plan(Matrix(concurrency=[0]), seed_target())


def test_cells_serialise():
    cell = plan(Matrix.preset("quick"), seed_target())[0]
    d = cell.to_dict()
    assert d["id"] == "prefill-c1024-r0" and d["label"] == "1K" and d["status"] is None


def test_prefill_cells_over_the_kv_pool_are_over_capacity():
    m = Matrix(contexts=[1024], concurrency=[1], max_output=64, prefill_contexts=[1024, 8192])
    p = plan(m, seed_target(kv_tokens=4096))
    by_id = p.by_id()
    assert by_id["prefill-c1024-r0"].status is None
    cell = by_id["prefill-c8192-r0"]
    assert cell.status == "over_capacity"
    assert cell.reason == "1 × (8192 + 1) = 8,193 tokens > KV capacity 4,096 tokens"


#: what a planned cell carries of the matrix, so that the sweep never reads the matrix to
#: measure one (issue 19: "a straight line from flag to core")
CARRIED = (
    "api",
    "extra",
    "request_idle_timeout_s",
    "stall_min_s",
    "stall_gap_factor",
    "precision",
    "min_duration_s",
    "ramp_cap_s",
    "percentiles",
    "slo",
)


def test_every_planned_cell_carries_what_the_core_and_verdict_need():
    from speedmatrix.plan import search_cell

    m = Matrix(
        contexts=[2048],
        concurrency=[1, 2],
        prefill_contexts=[1024],
        api="chat",
        extra={"temperature": 0.5},
        request_idle_timeout_s=33.0,
        stall_min_s=3.0,
        stall_gap_factor=30.0,
        precision=0.05,
        min_duration_s=6.0,
        ramp_cap_s=90.0,
        percentiles=[50, 99],
        slo={"ttft": 2000.0},
    )
    planned = plan(m, None, kv_tokens=1_000_000, context_length=32768)
    cells = [*planned, search_cell(m, planned, 2048, 4)]
    for cell in cells:
        for name in CARRIED:
            assert getattr(cell, name) == getattr(m, name), (cell.id, name)
    cells[0].extra["top_k"] = 1  # a cell's copy: the matrix (and the other cells) unchanged
    assert m.extra == {"temperature": 0.5} and cells[1].extra == {"temperature": 0.5}


def test_the_sweep_measures_a_cell_from_the_cell_not_the_matrix():
    """The sweep's code (every module of its package) reads none of the fields a planned
    cell carries from its matrix."""
    import re
    from pathlib import Path

    from speedmatrix import sweep

    parts = sorted(Path(sweep.__file__).parent.glob("*.py"))
    assert len(parts) > 1
    source = "\n".join(p.read_text() for p in parts)
    read = set(re.findall(r"self\.matrix\.([a-z_]+)", source))
    assert read  # the check sees the sweep's reads (its own fields: idle_timeout_s, search)
    assert not read & set(CARRIED), read & set(CARRIED)
