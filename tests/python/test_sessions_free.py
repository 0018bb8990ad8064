"""Free-running sessions (`speedmatrix.sessions.run_feeder`): the feeder's hand-over on a
fake chain feed, the turn columns it leaves, and the send-lateness figure and flag on
synthetic records (the runs against the built-in engine are in test_sessions_e2e.py)."""

from __future__ import annotations

import json
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from speedmatrix import sessions
from speedmatrix.records import Records
from speedmatrix.verdict.cells import CellShape
from speedmatrix.verdict.flags import Evidence, flags_of
from speedmatrix.verdict.rules import Rules
from speedmatrix.verdict.sessions import send_late_p99_ms, session_cell

MS = 1_000_000
N, TURNS, FIRST, OUT, STEP = 2, 3, 4, 3, 2


def _chat() -> sessions.Chat:
    # session s's pool: the last turn's prompt, exactly (4 + 2 x (3 + 2) ids)
    pools = [
        [100 * (s + 1) + i for i in range(FIRST + (TURNS - 1) * (OUT + STEP))] for s in range(N)
    ]
    return sessions.Chat(pools, FIRST, 1, OUT, STEP, TURNS)


class _Out:  # a _core.RequestOutput
    def __init__(self, ids: list[int] | None, text: str = "") -> None:
        self.token_ids, self.text, self.truncated = ids, text, False


def _done(session: int, turn: int, ids: list[int] | None, ok: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        session=session,
        turn=turn,
        body=turn * N + session,
        outcome=1 if ok else 3,
        output=_Out(ids),
    )


class FakeFeed:
    """A chain feed whose server answers session s with ``answers[s]`` at once: a push
    finishes that turn. Closed once nothing is left to hand out."""

    def __init__(self, first: list[SimpleNamespace], answers: dict[int, list[int]]) -> None:
        self.queue = deque(first)
        self.answers = answers
        self.pushed: list[tuple[int, list[int]]] = []
        self.ended: list[int] = []
        self.closed = False
        self.turn = {d.session: d.turn for d in first}

    def next_finished(self, timeout_s: float):
        if self.queue:
            return self.queue.popleft()
        self.closed = True
        return None

    def push(self, session: int, body: bytes) -> bool:
        self.pushed.append((session, json.loads(body)))
        self.turn[session] += 1
        self.queue.append(_done(session, self.turn[session], self.answers[session]))
        return True

    def end_session(self, session: int) -> bool:
        self.ended.append(session)
        return True


def _body(session: int, ids: list[int]) -> bytes:
    return json.dumps(ids).encode()


def test_the_feeder_pushes_each_sessions_next_prompt_as_its_own_answer_arrives() -> None:
    chat = _chat()
    # session 1 answers first; each answers its own length (the stream's ids)
    feed = FakeFeed([_done(1, 0, [7]), _done(0, 0, [5, 5, 5])], {0: [5, 5, 5], 1: [7]})
    sessions.run_feeder(feed, chat, _body, {})
    # session 1's turn 1 went out before session 0's turn 0 was even looked at
    assert [s for s, _ in feed.pushed] == [1, 0, 1, 0]
    pool1 = chat.pools[1]
    msg1 = pool1[FIRST + OUT : FIRST + OUT + STEP]  # turn 1's new message
    assert feed.pushed[0] == (1, pool1[:FIRST] + [7] + msg1)
    # turn 2 = turn 1's prompt + its answer + the next message
    msg2 = pool1[FIRST + 2 * OUT + STEP : FIRST + 2 * (OUT + STEP)]
    assert feed.pushed[2] == (1, pool1[:FIRST] + [7] + msg1 + [7] + msg2)
    # exact prompt tokens per body (the server's own BOS counted), every answer kept
    assert chat.prompt_tokens == {0: 5, 1: 5, 2: 10, 3: 8, 4: 15, 5: 11}
    assert sorted(chat.answers) == [0, 1, 2, 3, 4, 5]  # the last turns' too, no push for them
    assert chat.answers[5].ids == [7] and chat.answers[5].source == "stream"


def test_a_failed_turn_goes_on_with_a_stand_in_and_a_body_that_cannot_be_built_ends_its_session():
    chat = _chat()
    feed = FakeFeed([_done(0, 0, [5], ok=False), _done(1, 0, [7])], {0: [5], 1: [7]})

    def body_of(session: int, ids: list[int]) -> bytes:
        if session == 1:
            raise ValueError("prompt too long for the context")
        return _body(session, ids)

    sessions.run_feeder(feed, chat, body_of, {})
    stand_in = chat.pools[0][FIRST : FIRST + OUT]
    assert chat.answers[0].source == "stand_in"
    assert chat.answers[0].reason == "the turn did not complete"
    assert feed.pushed[0][1][FIRST : FIRST + OUT] == stand_in
    assert feed.ended == [1]
    assert chat.ended == {1: "ValueError: prompt too long for the context"}
    cols = sessions.turn_columns(np.asarray([0, 1, 2, 3]), chat, [-1, -1, 42 * MS, -1])
    assert list(cols["turn"]) == [0, 0, 1, 1] and list(cols["session"]) == [0, 1, 0, 1]
    assert list(cols["body_ready_ns"]) == [-1, -1, 42 * MS, -1]
    # body 3 was never sent: a stand-in, its session's end said
    assert cols["answer_source"][3] == "stand_in"
    assert cols["answer_reason"][1] == "session ended: ValueError: prompt too long for the context"
    assert cols["turn_prompt_tokens"][3] == -1


def test_turns_finished_before_the_close_are_all_taken() -> None:
    chat = _chat()
    feed = FakeFeed([_done(0, 2, [5]), _done(1, 2, [7])], {0: [5], 1: [7]})
    feed.closed = True  # the cell ended with two turns still queued
    sessions.run_feeder(feed, chat, _body, {})
    assert sorted(chat.answers) == [4, 5] and feed.pushed == []


def _late_records(late_ms: list[float], turns: list[int], sent: list[bool]) -> Records:
    n = len(late_ms)
    due = (1000 + 100 * np.arange(n)) * MS
    req = {
        "phase": np.ones(n, np.uint8),
        "body": np.asarray([t * N + i % N for i, t in enumerate(turns)], np.int32),
        "scheduled_ns": due.astype(np.int64),
        "sent_ns": np.where(sent, due + np.asarray(late_ms) * MS, -1).astype(np.int64),
        "first_token_ns": np.where(sent, due + 200 * MS, -1).astype(np.int64),
        "done_ns": np.where(sent, due + 300 * MS, -1).astype(np.int64),
        "outcome": np.where(sent, 1, 4).astype(np.uint8),
        "output_tokens": np.full(n, 3, np.int64),
        "error_kind": [""] * n,
    }
    ev = {k: np.zeros(0, np.int64) for k in ("request", "t_ns", "tokens", "server_ns")}
    return Records(requests=req, events=ev, window_start_ns=MS, window_end_ns=2000 * MS, end_ns=0)


@pytest.mark.parametrize(
    "late_ms, turns, sent, p99",
    [
        ([0, 0, 1, 3], [0, 0, 1, 1], [True] * 4, 1 + 0.99 * 2),  # later turns only
        ([500, 500, 2, 2], [0, 0, 1, 2], [True] * 4, 2.0),  # turn 0 is never late
        ([0, 0, 5, 900], [0, 0, 1, 1], [True, True, True, False], 5.0),  # unsent: no send
        ([0, 0], [0, 0], [True, True], None),  # no later turn
        ([0] * 2 + [1] * 99 + [80], [0, 0] + [1] * 100, [True] * 102, 1 + 0.01 * 79),
    ],
)
def test_send_lateness_is_the_p99_of_sent_minus_due_over_later_turns(late_ms, turns, sent, p99):
    rec = _late_records(late_ms, turns, sent)
    rows = np.arange(len(late_ms))
    got = send_late_p99_ms(rec.requests, rows, np.asarray(turns))
    assert got == pytest.approx(p99) if p99 is not None else got is None


@pytest.mark.parametrize(
    "late, limit, flagged",
    [
        (None, 50.0, False),
        (10.0, 50.0, False),
        (50.0, 50.0, False),
        (50.5, 50.0, True),
        (20.0, 10.0, True),
    ],
)
def test_sessions_late_flags_a_feeder_beyond_the_rule(late, limit, flagged) -> None:
    flags = flags_of(
        Evidence(session_send_late_p99_ms=late), Rules().replace(sessions_late_ms=limit)
    )
    assert ("sessions_late" in flags) is flagged


def test_a_sessions_cell_carries_its_lateness_and_flag() -> None:
    shape = CellShape("s", "session", 512, "512", N, sessions=2, max_output=3)
    on_time = session_cell(shape, _late_records([0, 0, 1, 2], [0, 0, 1, 1], [True] * 4), idle=True)
    assert on_time["session_send_late_p99_ms"] == pytest.approx(1.99)
    assert "sessions_late" not in on_time["flags"]
    late = session_cell(shape, _late_records([0, 0, 90, 120], [0, 0, 1, 1], [True] * 4), idle=True)
    assert late["session_send_late_p99_ms"] == pytest.approx(119.7)
    assert "sessions_late" in late["flags"]
    assert late["status"] == "valid"  # a doubt, not a failure
