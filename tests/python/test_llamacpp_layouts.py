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
    engine = "llamacpp"
    kv_tokens = None
    context_length = 12288
    max_running = 2
    info = {"kv_layout": kv_layout(12288, 2, {})}


def test_an_unknown_layout_claims_no_pool():
    m = model_for(_Target())
    assert m.family == "per_slot" and m.pool_tokens is None and m.slot_tokens == 12288
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
