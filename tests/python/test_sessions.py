"""Sessions with the server's real answers (`speedmatrix.sessions`): where an answer's ids
come from, the turn columns, and the per-turn figures they give (table tests on synthetic
records; the runs against engines are in test_sessions_e2e.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from speedmatrix import sessions
from speedmatrix.adapters import TokenizeSpec
from speedmatrix.localtokenizer import local_ids
from speedmatrix.records import Records
from speedmatrix.verdict.cells import CellShape
from speedmatrix.verdict.sessions import session_cell

MS = 1_000_000


@dataclass
class Out:  # a _core.RequestOutput's fields
    text: str = ""
    token_ids: list[int] | None = None
    truncated: bool = False


def _tokenize(text: str) -> list[int]:
    return [len(w) for w in text.split()]


def _fails(text: str) -> list[int]:
    raise ValueError("404 not found")


STAND_IN = [9, 9, 9]


@pytest.mark.parametrize(
    "output, ok, tokenize, tokenizer, ids, source, reason",
    [
        (Out("a bb", [5, 6]), True, _tokenize, None, [5, 6], "stream", ""),
        (Out("a bb", []), True, _tokenize, None, [], "stream", ""),  # an empty answer
        (Out("a bb"), True, _tokenize, _fails, [1, 2], "tokenize", ""),
        (Out("a bb"), True, _fails, _tokenize, [1, 2], "tokenizer", ""),
        (Out("a bb"), True, None, _tokenize, [1, 2], "tokenizer", ""),
        (Out("a bb"), True, _fails, None, STAND_IN, "stand_in", "tokenize: 404 not found"),
        (
            Out("a bb"),
            True,
            None,
            None,
            STAND_IN,
            "stand_in",
            "the stream carried no token ids and there is no tokenize endpoint or --tokenizer",
        ),
        (Out("a", [1]), False, _tokenize, None, STAND_IN, "stand_in", "the turn did not complete"),
        (None, True, _tokenize, None, STAND_IN, "stand_in", "the turn did not complete"),
        (
            Out("a", [1], truncated=True),
            True,
            _tokenize,
            None,
            STAND_IN,
            "stand_in",
            "the answer passed the kept-output cap",
        ),
    ],
)
def test_answer_ids_come_from_the_stream_then_tokenize_then_tokenizer_then_a_stand_in(
    output, ok, tokenize, tokenizer, ids, source, reason
) -> None:
    got = sessions.answer_of(output, ok, STAND_IN, tokenize=tokenize, tokenizer=tokenizer)
    assert (got.ids, got.source, got.reason) == (ids, source, reason)


def test_segments_of_a_pool_are_stand_in_then_message_per_turn() -> None:
    pool = list(range(100))
    # turn 0's prompt: the first 10 ids; then per turn 3 stand-in ids and 4 message ids
    assert sessions.segment(pool, 10, 3, 4, 1) == ([10, 11, 12], [13, 14, 15, 16])
    assert sessions.segment(pool, 10, 3, 4, 2) == ([17, 18, 19], [20, 21, 22, 23])
    # all stand-ins: turn k's prompt is the pool's first turn_tokens_at(k) - overhead ids
    prompt = pool[:10]
    for k in (1, 2):
        stand_in, message = sessions.segment(pool, 10, 3, 4, k)
        prompt = prompt + stand_in + message
        assert prompt == pool[: sessions.turn_tokens_at(11, 4, 3, k) - 1]


class _Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class _HF:  # transformers: encode(text, add_special_tokens=...)
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [len(w) for w in text.split()]


class _Tokenizers:  # tokenizers.Tokenizer: encode(...) -> Encoding
    def encode(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        return _Encoding([7] * len(text.split()))


class _Plain:  # an encode without the keyword
    def encode(self, text: str) -> list[int]:
        return [3]


@pytest.mark.parametrize(
    "tokenizer, ids", [(_HF(), [2, 3]), (_Tokenizers(), [7, 7]), (_Plain(), [3])]
)
def test_local_ids_add_no_special_tokens(tokenizer, ids) -> None:
    assert local_ids(tokenizer, "ab cde") == ids


def test_local_ids_refuse_a_count() -> None:
    with pytest.raises(TypeError, match="no token ids"):
        local_ids(lambda text: 3, "ab")


def _turn(k: int, prompts: list[int], answers: list[sessions.Answer], cached: list[int]):
    """Turn k of len(prompts) sessions, every request completed, with its turn columns:
    session s's request sends body k x N + s."""
    n = len(prompts)
    t0 = (1 + 2 * k) * 1_000 * MS
    return {
        "phase": np.ones(n, np.uint8),
        "body": k * n + np.arange(n, dtype=np.int32),
        "scheduled_ns": np.full(n, t0, np.int64),
        "sent_ns": np.full(n, t0, np.int64),
        "first_token_ns": np.full(n, t0 + 50 * MS, np.int64),
        "done_ns": np.full(n, t0 + 100 * MS, np.int64),
        "outcome": np.ones(n, np.uint8),
        "prompt_tokens": np.asarray(prompts, np.int64),
        "output_tokens": np.asarray([len(a.ids) for a in answers], np.int64),
        "cached_tokens": np.asarray(cached, np.int64),
        "error_kind": [""] * n,
        "turn": np.full(n, k, np.int32),
        "session": np.arange(n, dtype=np.int32),
        "turn_prompt_tokens": np.asarray(prompts, np.int64),
        "answer_tokens": np.asarray([len(a.ids) for a in answers], np.int64),
        "answer_source": np.asarray([a.source for a in answers], np.str_),
        "answer_reason": np.asarray([a.reason for a in answers], np.str_),
        "body_ready_ns": np.full(n, -1 if k == 0 else t0, np.int64),
    }


def _records(turns: list[dict]) -> Records:
    """The cell's one record set from its turns' request rows."""
    req = {
        key: np.concatenate([t[key] for t in turns])
        if isinstance(turns[0][key], np.ndarray)
        else [v for t in turns for v in t[key]]
        for key in turns[0]
    }
    ev = {
        "request": np.zeros(0, np.int32),
        "t_ns": np.zeros(0, np.int64),
        "tokens": np.zeros(0, np.int32),
        "server_ns": np.zeros(0, np.int64),
    }
    end = int(req["done_ns"].max())
    return Records(requests=req, events=ev, window_start_ns=MS, window_end_ns=end, end_ns=end)


def _answer(n: int, source: str = "stream", reason: str = "") -> sessions.Answer:
    return sessions.Answer(list(range(n)), source, reason)


def test_the_cached_prefix_of_a_turn_is_the_previous_prompt_and_its_real_answer() -> None:
    # two sessions, three turns of 64-token messages; answers of their own lengths (EOS):
    # session 0 answers 20 then 30 tokens, session 1 answers 32 (a stand-in) then 10
    p0 = [512, 512]
    a0 = [_answer(20), _answer(32, "stand_in", "tokenize: 404")]
    p1 = [512 + 20 + 64, 512 + 32 + 64]
    a1 = [_answer(30), _answer(10, "tokenize")]
    p2 = [p1[0] + 30 + 64, p1[1] + 10 + 64]
    a2 = [_answer(8), _answer(8)]
    parts = [
        _turn(0, p0, a0, [0, 0]),
        _turn(1, p1, a1, [512 + 20, 512]),
        _turn(2, p2, a2, [p1[0] + 30, p1[1] + 10]),
    ]
    merged = _records(parts)
    assert list(merged.requests["turn"]) == [0, 0, 1, 1, 2, 2]
    assert list(merged.requests["session"]) == [0, 1, 0, 1, 0, 1]
    shape = CellShape(
        "session-c512-n2-t3-r0", "session", 512, "512", 2, sessions=3, turn_tokens=64, max_output=32
    )
    cell = session_cell(shape, merged, idle=True)
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["session_turn_prompt_tokens"] == [512, int(np.median(p1)), int(np.median(p2))]
    # turn 1: session 0 finds 512 + 20, session 1 only its prompt (its answer was a stand-in)
    assert cell["session_turn_cached_tokens"] == [
        0,
        int(np.median([532, 512])),
        int(np.median([p1[0] + 30, p1[1] + 10])),
    ]
    # the synthetic server reported finding exactly that
    assert cell["session_turn_cached_tokens"] == cell["session_turn_delivered_cached_tokens"]
    assert cell["session_turn_answer_tokens"] == [26, 20, 8]
    assert cell["session_answer_source"] == {"stand_in": 1, "stream": 4, "tokenize": 1}
    assert cell["session_answer_reason"] == "tokenize: 404"
    assert cell["session_answer_tokens"] == 32  # the cap a stand-in takes


def test_a_run_saved_before_the_turn_columns_keeps_its_stand_in_figures() -> None:
    part = _turn(0, [512, 512], [_answer(32), _answer(32)], [0, 0])
    part2 = _turn(1, [608, 608], [_answer(32), _answer(32)], [512, 512])
    for key in sessions.TURN_COLUMNS:
        del part[key], part2[key]
    shape = CellShape("s", "session", 512, "512", 2, sessions=2, turn_tokens=64, max_output=32)
    cell = session_cell(shape, _records([part, part2]), idle=True)
    assert cell["session_turn_cached_tokens"] == [0, 512]  # stand-ins: the prompt alone
    assert cell["session_turn_prompt_tokens"] == [512, 608]
    assert cell["session_answer_source"] is None


class _Client:
    def __init__(self, answer) -> None:
        self.answer, self.sent = answer, None

    def post_json(self, path: str, body: dict):
        self.sent = (path, body)
        return self.answer


@pytest.mark.parametrize(
    "style, answer, body, ids",
    [
        ("llamacpp", {"tokens": [4, 5]}, {"content": "a b", "add_special": False}, [4, 5]),
        (
            "openai",
            {"tokens": [4, 5], "count": 2},
            {"prompt": "a b", "model": "m", "add_special_tokens": False},
            [4, 5],
        ),
        ("openai", {"count": 2}, None, None),  # a count without ids: no answer ids
    ],
)
def test_tokenize_ids_add_no_special_tokens(style, answer, body, ids) -> None:
    spec = TokenizeSpec("/tokenize", style)
    client = _Client(answer)
    if ids is None:
        with pytest.raises(ValueError, match="without token ids"):
            spec.ids(client, "m", "a b")
        return
    assert spec.ids(client, "m", "a b") == ids
    assert client.sent == ("/tokenize", body)
