"""A sessions cell's stored form (`speedmatrix.sessions` runs it): N conversations of T
turns; per turn the median TTFT against the cached prefix the turn found, and over the
cell the time between tokens, the sessions' duration, turns/s and output tok/s.

Reads the cell's one record set (free-running sessions: `speedmatrix.sessions`): session
s's turn k is body k x N + s, and the rows carry the columns
`speedmatrix.sessions.TURN_COLUMNS` (a run saved before them: every answer was a stand-in of
max_output tokens, and the figures below fall back to that plan).

- ``session_ttft_ms_by_turn``: per turn, the median first token - send over its requests that
  reached a first token (None for a turn where none did);
- ``session_turn_prompt_tokens``: per turn, the median prompt tokens sent (the server's own
  tokens included);
- ``session_turn_cached_tokens``: per turn, the median over sessions of the prompt tokens
  the server had seen: the previous turn's prompt and, unless it was a stand-in, its answer;
- ``session_turn_answer_tokens``: per turn, the median tokens of its answers (the ids the
  next prompt carries);
- ``session_answer_source``: how many answers' ids came from each source (stream, tokenize,
  tokenizer, stand_in); ``session_answer_reason``: why the first stand-in was one ("" none);
- ``session_turn_delivered_cached_tokens``: per turn, the median cached prompt tokens the
  server reported (usage ``cached_tokens``; None where it did not say);
- ``session_tbt_ms``: the median gap between two token deliveries of one request, over
  every request of every turn, a delivery of k tokens counted k times (its gap / k each);
- ``session_duration_s``: the median over sessions of its last answer's end - its first
  send (think time included);
- ``session_turns_per_s``: completed turns / (the last end - the first send);
- ``session_output_tok_s``: output tokens of every turn / that same span;
- ``session_send_late_p99_ms``: the p99 over later turns (k >= 1) that were sent of
  sent - scheduled, scheduled being when the turn was due (its answer's end + the think
  time): how late the feeder's body made the send (None: no later turn was sent). A run
  saved in lock step scheduled each turn at its own start, so it reads about 0.

Status: ``valid`` when every turn of every session completed; ``error`` otherwise, with how
many did not and the errors by kind. Flags: `flags_of` with the send lateness as evidence
(``sessions_late``: beyond `Rules.sessions_late_ms`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from speedmatrix.records import Records
from speedmatrix.sessions import turn_tokens_at
from speedmatrix.verdict.cells import base_cell
from speedmatrix.verdict.counts import window_errors
from speedmatrix.verdict.flags import Evidence, flags_of
from speedmatrix.verdict.names import Status
from speedmatrix.verdict.rules import Rules
from speedmatrix.verdict.window import OK

__all__ = ["session_cell", "session_figures"]


def _median(values: Any) -> float | None:
    v = np.asarray(values, dtype=float)
    return float(np.median(v)) if v.size else None


def _tbt_samples(records: Records, rows: np.ndarray) -> np.ndarray:
    ev = records.events
    out = []
    for i in rows:
        mine = ev["tokens"][ev["request"] == i] > 0
        t = ev["t_ns"][ev["request"] == i][mine]
        k = ev["tokens"][ev["request"] == i][mine]
        if len(t) > 1:
            gaps = np.diff(t) / k[1:] / 1e6
            out.append(np.repeat(gaps, k[1:]))
    return np.concatenate(out) if out else np.zeros(0)


def _delivered_by_turn(req: dict, rows: np.ndarray, turn: np.ndarray, turns: int) -> list:
    """Per turn, the median cached prompt tokens the server reported (usage cached_tokens);
    None for a turn where no request said, or a record without the column."""
    if "cached_tokens" not in req:
        return [None] * turns
    cached = req["cached_tokens"][rows]
    out = []
    for k in range(turns):
        said = cached[(turn == k) & (cached >= 0)]
        out.append(int(np.median(said)) if said.size else None)
    return out


def send_late_p99_ms(req: dict, rows: np.ndarray, turn: np.ndarray) -> float | None:
    """p99 of sent - scheduled (ms) over the later turns among ``rows`` that were sent."""
    sent, due = req["sent_ns"][rows], req["scheduled_ns"][rows]
    mine = (turn >= 1) & (sent > 0) & (due > 0)
    if not mine.any():
        return None
    return float(np.percentile((sent[mine] - due[mine]) / 1e6, 99))


def _per_turn(values: np.ndarray, turn: np.ndarray, turns: int) -> list[int | None]:
    return [int(np.median(values[turn == k])) if (turn == k).any() else None for k in range(turns)]


def _turn_figures(req: dict, rows: np.ndarray, turn: np.ndarray, shape: Any) -> dict[str, Any]:
    """The per-turn prompt and cached prefix, and the answers, from the turn columns; a run
    saved before them from the plan (stand-ins of max_output tokens, none of them cached)."""
    turns, out = int(shape.sessions), int(shape.max_output)
    planned = [turn_tokens_at(shape.context, shape.turn_tokens, out, k) for k in range(turns)]
    if "answer_source" not in req:
        return {
            "session_turn_prompt_tokens": planned,
            "session_turn_cached_tokens": [0] + planned[:-1],
            "session_turn_answer_tokens": [out] * turns,
            "session_answer_source": None,
            "session_answer_reason": None,
        }
    prompt = req["turn_prompt_tokens"][rows]
    answer = req["answer_tokens"][rows]
    source = np.asarray(req["answer_source"])[rows]
    seen = prompt + np.where(source == "stand_in", 0, answer)  # what the next turn finds
    session = req["session"][rows]
    cached: list[int | None] = [0]
    for k in range(1, turns):
        before = {int(s): int(v) for s, v in zip(session[turn == k - 1], seen[turn == k - 1])}
        mine = [before[int(s)] for s in session[turn == k] if int(s) in before]
        cached.append(int(np.median(mine)) if mine else None)
    reasons = [str(r) for r in np.asarray(req["answer_reason"])[rows] if str(r)]
    return {
        "session_turn_prompt_tokens": _per_turn(prompt, turn, turns),
        "session_turn_cached_tokens": cached,
        "session_turn_answer_tokens": _per_turn(answer, turn, turns),
        "session_answer_source": {
            str(s): int(np.count_nonzero(source == s)) for s in np.unique(source)
        },
        "session_answer_reason": reasons[0] if reasons else "",
    }


def session_figures(records: Records, shape: Any) -> dict[str, Any]:
    """The cell's figures from its merged records and its plan (`shape`)."""
    req = records.requests
    n, turns = int(shape.concurrency), int(shape.sessions)
    rows = np.flatnonzero(req["phase"] == 1)
    turn = req["body"][rows] // n
    first, sent = req["first_token_ns"][rows], req["sent_ns"][rows]
    ok = req["outcome"][rows] == OK
    ttft = []
    for k in range(turns):
        mine = (turn == k) & (first > 0)
        ttft.append(_median((first[mine] - sent[mine]) / 1e6))
    out: dict[str, Any] = {
        "session_ttft_ms_by_turn": ttft,
        "session_turn_delivered_cached_tokens": _delivered_by_turn(req, rows, turn, turns),
        **_turn_figures(req, rows, turn, shape),
        "session_tbt_ms": _median(_tbt_samples(records, rows)),
        "session_turns_completed": int(np.count_nonzero(ok)),
        "session_send_late_p99_ms": send_late_p99_ms(req, rows, turn)
        if "scheduled_ns" in req
        else None,
    }
    done = req["done_ns"][rows]
    if ok.any():
        span_s = (done[ok].max() - sent[sent > 0].min()) / 1e9
        session = req["body"][rows] % n
        durations = [
            (done[session == s].max() - sent[session == s].min()) / 1e9
            for s in range(n)
            if (session == s).any() and ok[session == s].all()
        ]
        out.update(
            session_duration_s=_median(durations),
            session_turns_per_s=int(np.count_nonzero(ok)) / span_s if span_s > 0 else None,
            session_output_tok_s=float(req["output_tokens"][rows][ok].sum()) / span_s
            if span_s > 0
            else None,
        )
    return out


def session_cell(shape: Any, records: Records, *, idle: bool, rules: Rules | None = None) -> dict:
    """The stored cell: `base_cell`'s fields, the session figures, status and flags (judged
    by ``rules``, the defaults when None)."""
    base = base_cell(shape)
    base.update(
        sessions=int(shape.sessions),
        turn_tokens=int(shape.turn_tokens),
        think_time_s=float(shape.think_time_s),
        session_answer_tokens=int(shape.max_output),
    )
    base.update(window_errors(records))
    errors = base["errors"]
    base.update(session_figures(records, shape))
    late = base["session_send_late_p99_ms"]
    base["flags"] = flags_of(Evidence(idle=idle, session_send_late_p99_ms=late), rules or Rules())
    expected = int(shape.sessions) * int(shape.concurrency)
    missing = expected - base["session_turns_completed"]
    if records.fatal_error:
        base["status"], base["reason"] = Status.ERROR.value, records.fatal_error
    elif missing:
        base["status"] = Status.ERROR.value
        base["reason"] = f"{missing} of {expected} turns did not complete" + (
            f" ({', '.join(f'{k}: {v}' for k, v in sorted(errors.items()))})" if errors else ""
        )
    else:
        base["status"] = Status.VALID.value
    return base
