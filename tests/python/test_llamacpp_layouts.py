"""llama.cpp's KV layout is read where the server says it, never guessed from numbers
(fast tier), and prompts converge on a vocabulary and template unlike the tests' own."""

from __future__ import annotations

import pytest
from speedmatrix.adapters.llamacpp import kv_layout
from speedmatrix.capacity import model_for
from speedmatrix.prompts import PromptError, build_prompts, clear_calibrations
from test_prompts import FakeEngine

# (n_ctx, total_slots, /props, unified?)
LAYOUTS = [
    # -np 2 -c 12288 --kv-unified on a 16K model: 12288 per slot (the pool); the old
    # inference called it split (below the trained context) and planned 24,576 tokens
    (12288, 2, {}, None),
    # -np 2 -c 12288 (split): 6144 per slot, the same shape of numbers
    (6144, 2, {}, None),
    # the default launch (4 slots, unified, n_ctx = n_ctx_train): also not stated
    (4096, 4, {}, None),
    (4096, 1, {}, False),  # one slot: its cache is the pool
    (12288, 2, {"kv_unified": True}, True),  # a build that states it is believed
    (6144, 2, {"kv_unified": False}, False),
    (None, 2, {}, None),
]


@pytest.mark.parametrize(("n_ctx", "slots", "props", "unified"), LAYOUTS)
def test_the_layout_is_what_the_server_says(n_ctx, slots, props, unified):
    assert kv_layout(n_ctx, slots, props)["unified"] is unified


class _Target:
    def __init__(self) -> None:
        self.engine = "llamacpp"
        self.kv_tokens = None
        self.context_length = 12288
        self.max_running = 2
        self.info = {"kv_layout": kv_layout(12288, 2, {})}


def test_an_unknown_layout_claims_no_pool():
    m = model_for(_Target())
    assert m.family == "per_slot" and m.pool_tokens is None and m.slot_tokens == 12288
    assert "refuses for lack of context is over capacity" in m.note
    # 6K x 2 and x 3 are sent (the server's refusal judges them); 12K + output is not
    assert m.check(6144, 2, 128).status is None
    assert m.check(12288, 1, 128).status == "over_capacity"


def _bytes_like(text: str) -> int:
    """A template of 40 tokens, ~3 tokens per word (a vocabulary without these words),
    one per one-character piece: the shape that defeated a one-token-per-word search."""
    return 40 + sum(1 if len(w) == 1 else 3 for w in text.split())


@pytest.mark.parametrize("context", [256, 257, 258, 1000])
def test_prompts_converge_when_words_are_not_one_token(context):
    clear_calibrations()
    with FakeEngine(ids=False, tokenize=False) as eng:
        target = eng.target(tokenize=False)
        (p,) = build_prompts(target, context, 1, tokenizer=_bytes_like)
        assert _bytes_like(p.payload) == context


def test_fit_still_gives_up_when_no_count_is_reachable():
    with FakeEngine(ids=False, tokenize=False) as eng:
        target = eng.target(tokenize=False)
        with pytest.raises(PromptError, match="exactly 1001 tokens"):
            build_prompts(target, 1001, 1, tokenizer=lambda t: 2 * len(t.split()))


# ---- estimated_tokens when no request of the window completed ----------------------------
# token_source: 1 chunks, 2 usage_final; outcome: 1 ok, 2 cancelled
# (window sources, window outcomes, warm-up sources, warm-up outcomes, flagged)
ESTIMATED = [
    # 1K x 8 on -np 4 with long requests: the 4 running were cut (usage comes last), 4
    # never started; the warm-up's 8 completed with usage: not estimated
    ([1, 1, 1, 1, 0, 0, 0, 0], [2] * 8, [2] * 8, [1] * 8, False),
    # the warm-up completed without usage: the engine sends none
    ([1, 1], [2, 2], [1, 1], [1, 1], True),
    # nothing completed anywhere: the chunk counts are all there is
    ([1, 1], [2, 2], [1, 1], [2, 2], True),
    ([1, 1], [2, 2], None, None, True),
    # a completed window request decides, whatever the warm-up
    ([2, 1], [1, 2], [1], [1], False),
]


@pytest.mark.parametrize(("src", "out", "wsrc", "wout", "flagged"), ESTIMATED)
def test_a_window_without_completed_requests_is_judged_by_its_warmup(src, out, wsrc, wout, flagged):
    import numpy as np
    from speedmatrix.verdict import tokens_estimated

    warm = (None, None) if wsrc is None else (np.array(wsrc), np.array(wout))
    assert tokens_estimated(np.array(src), np.array(out), *warm) is flagged


@pytest.mark.llamacpp
@pytest.mark.e2e
def test_a_queued_split_slot_cell_of_long_requests_has_exact_tokens(binary, tmp_path_factory):
    """1K x 8 on -np 4, requests longer than the window: the running ones are cut before
    their final chunk (where llama.cpp puts usage); the cell is not estimated_tokens."""
    from speedmatrix.matrix import Matrix
    from speedmatrix.prompts import WORDS
    from speedmatrix.sweep import run

    s = _serve(
        binary,
        tmp_path_factory,
        "split4",
        {"n_ctx_train": 4096, "words": WORDS},
        ["-np", "4", "-c", "8192"],
    )
    try:
        m = Matrix(contexts=[1024], concurrency=[8], max_output=1000, duration_s=1.0)
        out = tmp_path_factory.mktemp("split4run")
        result = run(s.url, m, out=out / "run", progress=False, report=False)
    finally:
        s.stop()
    (cell,) = result.doc["cells"]
    # measured (queued, as 8 > 4 slots; a 1 s window under load can hold too few /metrics
    # samples to show the queue, and the queue verdict on -np 4 is test_llamacpp's N = 5)
    assert cell["status"] in ("queued", "valid"), cell
    assert "estimated_tokens" not in cell["flags"], cell["flags"]
    req = result.requests
    warm = req[(req["phase"] == "warmup") & (req["outcome"] == "ok")]
    assert len(warm) and (warm["token_source"] >= 2).all()


# ---- live: llama.cpp in launches the other tests do not use -------------------------------
N_CTX_TRAIN_16K = 16384


@pytest.fixture(scope="module")
def binary():
    from test_llamacpp import _binary

    return _binary()


def _serve(binary, tmp_path_factory, name: str, model_kw: dict, args: list[str]):
    from test_llamacpp import LlamaServer
    from tiny_gguf import write_tiny_model

    folder = tmp_path_factory.mktemp(name)
    model = write_tiny_model(folder / f"{name}.gguf", **model_kw)
    return LlamaServer(binary, model, args, folder / "server.log")


@pytest.fixture(scope="module")
def unified_2x12k(binary, tmp_path_factory):
    from speedmatrix.prompts import WORDS

    s = _serve(
        binary,
        tmp_path_factory,
        "unified16k",
        {"n_ctx_train": N_CTX_TRAIN_16K, "words": WORDS},
        ["-np", "2", "-c", "12288", "--kv-unified"],
    )
    yield s
    s.stop()


@pytest.mark.llamacpp
@pytest.mark.e2e
def test_a_unified_pool_below_the_trained_context_is_judged_by_the_servers_refusal(
    unified_2x12k, tmp_path
):
    from speedmatrix import discover
    from speedmatrix.matrix import Matrix
    from speedmatrix.sweep import run

    t = discover(unified_2x12k.url)
    # 12288 per slot below the trained 16K: once inferred "split" with 24,576 tokens of KV
    assert t.context_length == 12288 and t.info["n_ctx_train"] == N_CTX_TRAIN_16K
    assert t.info["kv_layout"]["unified"] is None and t.kv_tokens is None
    m = Matrix(contexts=[6144], concurrency=[1, 2, 3], max_output=16, duration_s=1.0)
    result = run(unified_2x12k.url, m, out=tmp_path / "run", progress=False, report=False)
    cells = {(c["context"], c["concurrency"]): c for c in result.doc["cells"]}
    assert cells[(6144, 1)]["status"] == "valid", cells[(6144, 1)]
    for n in (2, 3):
        c = cells[(6144, n)]
        # sent, refused for lack of KV by the server: over capacity, in its words
        assert c["status"] == "over_capacity", c
        assert "Context size has been exceeded" in c["reason"], c["reason"]


@pytest.fixture(scope="module")
def verbose_template(binary, tmp_path_factory):
    s = _serve(
        binary,
        tmp_path_factory,
        "verbose",
        # a vocabulary of bytes (no common word is one token) and a ~40-token template
        {"n_ctx_train": 4096, "words": ("xyzzy",), "template": "verbose"},
        [],
    )
    yield s
    s.stop()


@pytest.mark.llamacpp
@pytest.mark.e2e
@pytest.mark.parametrize("context", [256, 1000])
def test_chat_prompts_are_exact_on_a_model_the_tests_do_not_ship(verbose_template, context):
    import json
    import urllib.request

    from speedmatrix import discover

    clear_calibrations()
    t = discover(verbose_template.url)
    prompts = build_prompts(t, context, 2, api="chat")
    for p in prompts:
        body = {"messages": p.payload, "max_tokens": 1}
        req = urllib.request.Request(
            verbose_template.url + "/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            usage = json.loads(r.read())["usage"]
        assert usage["prompt_tokens"] == context
