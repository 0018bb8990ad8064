"""Multi-turn sessions (``--sessions TURNS``): N conversations of T turns each, the first
turn's prompt C tokens; turn k + 1's prompt is turn k's prompt ids, then the ids of the
answer the server gave to it, then a new user message of ``turn_tokens`` tokens. The server
therefore finds turn k's prompt **and answer** in its prefix cache (vLLM and SGLang keep the
blocks of the tokens they generated), and computes only the new message. That prompt +
answer is turn k + 1's **cached prefix**, the axis its TTFT is shown against.

The answer's ids (`answer_of`), in order: the ids the stream carried (vLLM with
``return_token_ids``; the core keeps them: ``CellSpec.keep_output``); else the answer's text
through the server's tokenize endpoint (llama.cpp, vLLM, SGLang); else through the local
tokenizer (``--tokenizer``); else a **stand-in** of max_output tokens that are not the
server's words (the server then finds only the previous prompt cached), with the reason.
A re-tokenized text may not be the ids the server generated (a tokenizer need not
round-trip, a random model's words least of all): the server's own cached-token count
(`session_turn_delivered_cached_tokens`) says what it found.

Sessions run **free**, as real conversations do: the cell is one closed-loop run of N
slots whose core holds a chain feed (`_core.ChainFeed`, cpp/include/speedmatrix/chain.hpp).
The core sends the N first turns; when a session's request ends it hands the turn (outcome
and kept output) to the feed; `run_feeder`, on a Python thread, builds that session's next
prompt (the answer's ids, then the next message) and pushes its body; the core sends it at
the answer's end + ``think_time_s``, never waiting for the other sessions. So a session
whose answer came early goes on early, and later turns arrive as their sessions reach them,
not as a burst of N prefills. The cell ends when every session has done its T turns (or its
duration, T x ``duration_s``, ran out). One record set: session s's turn k is body
k x N + s, with the columns `TURN_COLUMNS`. A request's ``scheduled_ns`` is when its turn
was due, ``body_ready_ns`` when the feeder pushed its body: a feeder late by the GIL or a
slow tokenize endpoint shows in ``sent_ns - scheduled_ns`` (`session_send_late_p99_ms`, flag
``sessions_late``), it is not hidden. A turn that failed still gets a stand-in answer, so its
session goes on; a session whose next body cannot be built ends there, with the reason.
Prompts are token ids (the completions API), so that each turn's prompt is a true prefix of
the next; `speedmatrix.trafficrun` refuses another method in one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "ANSWER_SOURCES",
    "TURN_COLUMNS",
    "Answer",
    "Chat",
    "answer_of",
    "cached_prefix_tokens",
    "final_tokens",
    "finished_turns",
    "next_turn",
    "run_feeder",
    "run_lockstep_feeder",
    "segment",
    "turn_columns",
    "turn_ids",
    "turn_tokens_at",
]

#: where an answer's token ids came from, best first (`answer_of`)
ANSWER_SOURCES = ("stream", "tokenize", "tokenizer", "stand_in")
#: the per-request columns a sessions cell's records carry besides the core's
TURN_COLUMNS = (
    "turn",
    "session",
    "turn_prompt_tokens",
    "answer_tokens",
    "answer_source",
    "answer_reason",
    "body_ready_ns",
)
_OK = 1  # the records' outcome code of a completed request (Outcome::kOk)
#: a session's request body from its prompt ids: ``body_of(session, ids)``
BodyOf = Callable[[int, list[int]], bytes]


def turn_tokens_at(context: int, turn_tokens: int, output: int, k: int) -> int:
    """Prompt tokens of turn k (0-based)."""
    return context + k * (output + turn_tokens)


def final_tokens(context: int, turn_tokens: int, output: int, turns: int) -> int:
    """Prompt tokens of the last turn: what the server's context must hold with its output."""
    return turn_tokens_at(context, turn_tokens, output, turns - 1)


def cached_prefix_tokens(context: int, turn_tokens: int, output: int, k: int) -> int:
    """Planned tokens of turn k's prompt the server has seen, every answer max_output tokens:
    turn k-1's prompt and answer (0 for the first). A saved run's records say the truth
    (`speedmatrix.verdict.sessions`); this is the plan and the fallback for older runs."""
    return 0 if k == 0 else turn_tokens_at(context, turn_tokens, output, k - 1) + output


def turn_ids(full: list[int], overhead: int, tokens: int) -> list[int]:
    """Turn prompt of ``tokens`` tokens cut from a session's full (last-turn) token ids; the
    server adds ``overhead`` tokens of its own (a BOS), so the ids are ``tokens - overhead``."""
    return list(full[: tokens - overhead])


def segment(pool: list[int], first: int, output: int, turn_tokens: int, k: int):
    """(stand-in answer of turn k-1, new user message of turn k), k >= 1, cut from a
    session's id pool whose first ``first`` ids are turn 0's prompt: after them, per turn,
    max_output stand-in ids then turn_tokens message ids (all stand-ins: the pool is the
    last turn's prompt, exactly)."""
    start = first + (k - 1) * (output + turn_tokens)
    return list(pool[start : start + output]), list(
        pool[start + output : start + output + turn_tokens]
    )


@dataclass(frozen=True)
class Answer:
    """The ids a turn's answer adds to the next prompt, where they came from
    (`ANSWER_SOURCES`) and, for a stand-in, why."""

    ids: list[int]
    source: str
    reason: str = ""


def answer_of(
    output: Any,
    ok: bool,
    stand_in: list[int],
    tokenize: Callable[[str], list[int]] | None = None,
    tokenizer: Callable[[str], list[int]] | None = None,
) -> Answer:
    """A turn's answer ids from what its stream delivered (``output``: a
    `_core.RequestOutput`, or None), in order: the streamed ids; the server's ``tokenize``
    of its text; the local ``tokenizer``'s; else ``stand_in`` with the reason. ``ok``: the
    request completed (a failed turn's partial answer is not what a user would send on)."""
    if not ok or output is None:
        return Answer(stand_in, "stand_in", "the turn did not complete")
    if output.truncated:
        return Answer(stand_in, "stand_in", "the answer passed the kept-output cap")
    if output.token_ids is not None:
        return Answer(list(output.token_ids), "stream")
    failed = []
    for source, fn in (("tokenize", tokenize), ("tokenizer", tokenizer)):
        if fn is None:
            continue
        try:
            return Answer(list(fn(output.text)), source)
        except Exception as exc:  # noqa: BLE001 - any failure falls to the next source, said
            failed.append(f"{source}: {str(exc)[:160]}")
    why = "; ".join(failed) or (
        "the stream carried no token ids and there is no tokenize endpoint or --tokenizer"
    )
    return Answer(stand_in, "stand_in", why)


@dataclass
class Chat:
    """A cell's sessions as they grow, shared by the feeder thread (which writes) and the
    cell's measuring code (which reads once the cell and the feeder ended): each session's id
    pool (`segment`: the last turn's prompt, exactly), its current prompt ids, the tokens the
    server adds to every prompt (a BOS); and by body index (turn x N + session), each turn's
    prompt tokens and answer, and why a session ended early."""

    pools: list[list[int]]
    first: int  # ids of turn 0's prompt
    overhead: int
    output: int  # max_output: a stand-in answer's tokens
    turn_tokens: int
    turns: int
    prompts: list[list[int]] = field(default_factory=list)
    prompt_tokens: dict[int, int] = field(default_factory=dict)
    answers: dict[int, Answer] = field(default_factory=dict)
    ended: dict[int, str] = field(default_factory=dict)  # session -> why it ended early

    def __post_init__(self) -> None:
        if not self.prompts:
            self.prompts = [list(pool[: self.first]) for pool in self.pools]
        for s, ids in enumerate(self.prompts):
            self.prompt_tokens[s] = len(ids) + self.overhead

    @property
    def sessions(self) -> int:
        return len(self.pools)

    def cut(self, session: int, k: int) -> tuple[list[int], list[int]]:
        """(stand-in answer of turn k, message of turn k + 1) of a session (empty past the
        last turn)."""
        return segment(self.pools[session], self.first, self.output, self.turn_tokens, k + 1)

    def answer(self, body: int) -> Answer:
        """The answer of a turn: the feeder's, else (the cell ended first) a stand-in."""
        if body in self.answers:
            return self.answers[body]
        stand_in, _ = self.cut(body % self.sessions, body // self.sessions)
        return Answer(stand_in, "stand_in", "the turn did not complete")


def next_turn(chat: Chat, done: Any, body_of: BodyOf, ways: dict) -> Any:
    """One finished turn: its answer kept; the session's next body (its prompt + the answer
    + the next message), or None after its last turn."""
    s, k = int(done.session), int(done.turn)
    stand_in, message = chat.cut(s, k)
    answer = answer_of(done.output, done.outcome == _OK, stand_in, **ways)
    chat.answers[int(done.body)] = answer
    if k + 1 >= chat.turns:
        return None
    ids = chat.prompts[s] + answer.ids + message
    body = body_of(s, ids)
    chat.prompts[s] = ids
    chat.prompt_tokens[(k + 1) * chat.sessions + s] = len(ids) + chat.overhead
    return body


def run_feeder(
    feed: Any,
    chat: Chat,
    body_of: BodyOf,
    ways: dict[str, Callable[[str], list[int]]],
    wait_s: float = 0.05,
) -> None:
    """The feeder of a free-running sessions cell, on its own thread until the feed is
    closed and drained: each finished turn (`finished_turns`) gets its answer (`answer_of`:
    stream ids, tokenize endpoint, local tokenizer, stand-in) and the session's next turn
    (`next_turn`) is pushed at once; the core holds it to its due time. A turn whose next
    body cannot be built (any exception) ends its session, the reason kept in
    ``chat.ended``: the cell never waits on a feeder that failed.
    ``body_of(session, ids)``: the request body of a session's prompt ids."""
    for done in finished_turns(feed, wait_s):
        try:
            body = next_turn(chat, done, body_of, ways)
        except Exception as exc:  # noqa: BLE001 - a bad answer or body ends its session, said
            chat.ended[int(done.session)] = f"{type(exc).__name__}: {str(exc)[:160]}"
            feed.end_session(int(done.session))
            continue
        if body is not None:
            feed.push(int(done.session), body)


def run_lockstep_feeder(
    feed: Any, chat: Chat, body_of: BodyOf, ways: dict, think_time_s: float
) -> None:
    """The old lock step on the same chain, kept as the baseline free sessions are measured
    against (bench/sessions_free.py, tests/python/test_sessions_e2e.py): turn k + 1 of every
    session is pushed only once turn k of all of them finished, then ``think_time_s``, as one
    burst of N prefills. A body that cannot be built raises here: a baseline has no one to
    tell."""
    waiting: dict[int, Any] = {}
    for done in finished_turns(feed):
        body = next_turn(chat, done, body_of, ways)
        if body is not None:
            waiting[int(done.session)] = body
        if len(waiting) == chat.sessions:
            time.sleep(think_time_s)
            for s in sorted(waiting):
                feed.push(s, waiting[s])
            waiting.clear()


def finished_turns(feed: Any, wait_s: float = 0.05) -> Iterator[Any]:
    """Each finished turn of a chained cell (``feed.next_finished``, which waits up to
    ``wait_s`` with the GIL released), in the order they finished, until the feed is closed
    and every finished turn was taken."""
    while True:
        # closed read first: once it is, next_finished returns at once, and None only when
        # every finished turn was taken (none is lost to a close racing a timeout)
        closed = bool(feed.closed)
        done = feed.next_finished(0.0 if closed else wait_s)
        if done is not None:
            yield done
        elif closed:
            return


def turn_columns(bodies: np.ndarray, chat: Chat, ready_ns: list[int]) -> dict[str, np.ndarray]:
    """The `TURN_COLUMNS` of a sessions cell's request rows, from their body indices (turn
    x N + session), the chat the feeder grew and the feed's body_ready_ns by body."""
    n = chat.sessions
    rows = [int(b) for b in bodies]
    answers = [chat.answer(b) for b in rows]
    reasons = [
        a.reason or (f"session ended: {chat.ended[b % n]}" if b % n in chat.ended else "")
        for a, b in zip(answers, rows)
    ]
    return {
        "turn": np.asarray([b // n for b in rows], np.int32),
        "session": np.asarray([b % n for b in rows], np.int32),
        "turn_prompt_tokens": np.asarray([chat.prompt_tokens.get(b, -1) for b in rows], np.int64),
        "answer_tokens": np.asarray([len(a.ids) for a in answers], np.int64),
        "answer_source": np.asarray([a.source for a in answers], np.str_),
        "answer_reason": np.asarray(reasons, np.str_),
        "body_ready_ns": np.asarray(
            [ready_ns[b] if 0 <= b < len(ready_ns) else -1 for b in rows], np.int64
        ),
    }
