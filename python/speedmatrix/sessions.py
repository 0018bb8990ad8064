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

Turns run in **lock step**: turn k of every session is one closed-loop run of N slots, one
request each, then ``think_time_s`` of quiet, then turn k + 1 (whose prompts need turn k's
answers). `merge` joins the turns' records into the cell's one record set: turn k's requests
carry bodies k x N .. k x N + N - 1 (session s = body mod N) and the columns `TURN_COLUMNS`.
Prompts are token ids (the completions API), so that each turn's prompt is a true prefix of
the next; `speedmatrix.trafficrun` refuses another method in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from speedmatrix.records import Records

__all__ = [
    "ANSWER_SOURCES",
    "TURN_COLUMNS",
    "Answer",
    "answer_of",
    "cached_prefix_tokens",
    "final_tokens",
    "merge",
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
)


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


def turn_columns(
    turn: int, sessions: np.ndarray, prompt_tokens: list[int], answers: list[Answer]
) -> dict[str, np.ndarray]:
    """The `TURN_COLUMNS` of one turn's request rows: ``sessions`` per row, and per
    session its prompt tokens (server's own tokens included) and answer."""
    rows = [int(s) for s in sessions]
    return {
        "turn": np.full(len(rows), turn, np.int32),
        "session": np.asarray(rows, np.int32),
        "turn_prompt_tokens": np.asarray([prompt_tokens[s] for s in rows], np.int64),
        "answer_tokens": np.asarray([len(answers[s].ids) for s in rows], np.int64),
        "answer_source": np.asarray([answers[s].source for s in rows], np.str_),
        "answer_reason": np.asarray([answers[s].reason for s in rows], np.str_),
    }


_SUMMED = ("stalls", "warmup_retried", "backoffs", "backoff_s", "client_cpu_s")


def merge(parts: list[Records], streams: int) -> Records:
    """One record set from the turns' (in turn order): requests and events concatenated,
    bodies shifted by k x ``streams``, events' request indices by the requests before them;
    the window is the first turn's start to the last turn's end."""
    req: dict[str, Any] = {}
    keys = list(parts[0].requests)
    for key in keys:
        cols = [p.requests[key] for p in parts]
        if isinstance(cols[0], np.ndarray):
            if key == "body":
                cols = [c + k * streams for k, c in enumerate(cols)]
            req[key] = np.concatenate(cols)
        else:
            req[key] = [v for c in cols for v in c]
    offsets = np.cumsum([0] + [len(p.requests["phase"]) for p in parts[:-1]])
    ev: dict[str, Any] = {}
    for key in parts[0].events:
        cols = [p.events[key] for p in parts]
        if key == "request":
            cols = [c + int(o) for c, o in zip(cols, offsets)]
        ev[key] = np.concatenate(cols)
    names = parts[0].metrics.get("names") or []
    metrics = dict(parts[0].metrics)
    if names and all(p.metrics.get("names") == names for p in parts):
        metrics["t_ns"] = np.concatenate([p.metrics["t_ns"] for p in parts])
        metrics["values"] = np.concatenate([p.metrics["values"] for p in parts])
        metrics["failures"] = sum(int(p.metrics.get("failures", 0)) for p in parts)
    first, last = parts[0], parts[-1]
    return Records(
        requests=req,
        events=ev,
        metrics=metrics,
        ramp_start_ns=first.ramp_start_ns,
        ramp_capped=any(p.ramp_capped for p in parts),
        stopped_by=last.stopped_by,
        stop_reason=next((p.stop_reason for p in parts if p.stop_reason), ""),
        window_start_ns=first.window_start_ns,
        window_end_ns=last.window_end_ns,
        warmup_start_ns=first.warmup_start_ns,
        end_ns=last.end_ns,
        loop_lag_max_ms=max(p.loop_lag_max_ms for p in parts),
        fatal_error=next((p.fatal_error for p in parts if p.fatal_error), ""),
        **{k: sum(getattr(p, k) for p in parts) for k in _SUMMED},
    )
