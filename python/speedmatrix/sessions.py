"""Multi-turn sessions (``--sessions TURNS``): N conversations of T turns each, the first
turn's prompt C tokens; turn k's prompt is turn k-1's, then that turn's answer and a new
user message (``turn_tokens``), so it is C + k x (max_output + turn_tokens) tokens, exact.

The answer appended is a stand-in of max_output tokens, not the words the server
generated (the core never hands text back to Python): the server therefore finds turn
k-1's *prompt* in its prefix cache, and computes the answer and the new message. That
prompt is the turn's **cached prefix** (`cached_prefix_tokens`), the axis its TTFT is shown
against.

Turns run in lock step: turn k of every session is one closed-loop run of N slots, one
request each, then ``think_time_s`` of quiet, then turn k + 1. `merge` joins the turns'
records into the cell's one record set: turn k's requests carry bodies k x N .. k x N + N - 1
(session s = body mod N). Prompts are token ids (the completions API), so that each turn's
prompt is a true prefix of the next; `speedmatrix.trafficrun` refuses another method in
one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from speedmatrix.records import Records

__all__ = ["cached_prefix_tokens", "final_tokens", "merge", "turn_ids", "turn_tokens_at"]


def turn_tokens_at(context: int, turn_tokens: int, output: int, k: int) -> int:
    """Prompt tokens of turn k (0-based)."""
    return context + k * (output + turn_tokens)


def final_tokens(context: int, turn_tokens: int, output: int, turns: int) -> int:
    """Prompt tokens of the last turn: what the server's context must hold with its output."""
    return turn_tokens_at(context, turn_tokens, output, turns - 1)


def cached_prefix_tokens(context: int, turn_tokens: int, output: int, k: int) -> int:
    """Tokens of turn k's prompt the server has seen: turn k-1's prompt (0 for the first)."""
    return 0 if k == 0 else turn_tokens_at(context, turn_tokens, output, k - 1)


def turn_ids(full: list[int], overhead: int, tokens: int) -> list[int]:
    """Turn prompt of ``tokens`` tokens cut from a session's full (last-turn) token ids; the
    server adds ``overhead`` tokens of its own (a BOS), so the ids are ``tokens - overhead``."""
    return list(full[: tokens - overhead])


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
