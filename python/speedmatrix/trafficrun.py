"""Measuring the cells of issue 23's traffic shapes (`speedmatrix.trafficplan`) inside a
sweep: a cached-fraction cell (`speedmatrix.cachedcell`), a prefill-interference cell
(`speedmatrix.interference`), a trace replay (`speedmatrix.trace`) and a sessions cell
(`speedmatrix.sessions`).

Each function takes the running `speedmatrix.sweep.Sweep` and uses its own steps (the idle
wait, the CellSpec, the run on a worker thread, storing), so these cells are waited for,
interrupted, saved and resumed as every other; each returns the stored outcome, or None
when the run was interrupted. `measure` picks the one a cell needs, None for a grid cell.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, cast

from speedmatrix import interference, sessions
from speedmatrix._native import _core
from speedmatrix.adapters.discovery import get_adapter
from speedmatrix.cachedcell import WARM_INDEX, prompt_seed, read_counters, warm_prefix
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.localtokenizer import local_ids
from speedmatrix.prompts import PromptError, PromptFactory, request_body
from speedmatrix.records import Records
from speedmatrix.trace import BLOCK_TOKENS, load_trace, schedule_ns, shared_blocks
from speedmatrix.trafficplan import DECODE_PROMPT_TOKENS
from speedmatrix.verdict.interference import interference_cell
from speedmatrix.verdict.sessions import session_cell

__all__ = ["is_traffic_cell", "measure"]

#: seconds the prefix warm-up and a counters read may take
_CLIENT_TIMEOUT_S = 120.0


def is_traffic_cell(cell: Any) -> bool:
    return (
        cell.cached_fraction is not None
        or cell.phase in ("interference", "session")
        or bool(cell.trace)
    )


def measure(sweep: Any, cell: Any) -> Any:
    """Measures a traffic cell in ``sweep``; returns its outcome (None when interrupted)."""
    if cell.cached_fraction is not None:
        return _cached(sweep, cell)
    if cell.phase == "interference":
        return _interference(sweep, cell)
    if cell.phase == "session":
        return _sessions(sweep, cell)
    return _trace(sweep, cell)


def _factory(sweep: Any, cell: Any, context: int, seed: int | str, shared: int = 0):
    return PromptFactory(
        sweep.target,
        context,
        api=cell.api,
        shared_prefix=shared,
        seed=seed,
        tokenizer=sweep.tokenizer,
    )


def _body(sweep: Any, cell: Any, prompt: Any, max_tokens: int) -> bytes:
    return request_body(sweep.target, cell.api, prompt, max_tokens, extra=cell.extra)


def _run(sweep: Any, spec: Any) -> Records | None:
    res, interrupted = sweep._run_spec(spec)
    if interrupted:
        sweep.interrupted = True
        return None
    return Records.from_result(res)


def _failed(sweep: Any, cell: Any, exc: Exception) -> Any:
    out = sweep._prompt_failure(cell, exc)
    sweep._store(out)
    return out


def _cached(sweep: Any, cell: Any) -> Any:
    """N unique prompts sharing the cell's prefix, which one request sent first warmed;
    the server's counters read around the window."""
    idle, _ = sweep._wait_idle()
    # this process's nonce too: a cell measured again after --resume must not find the
    # prompts an interrupted try of it sent in the server's cache
    seed = prompt_seed(sweep.doc["meta"]["run"]["seed"], f"{cell.id}/{sweep._nonce}")
    try:
        factory = _factory(sweep, cell, cell.context, seed, cell.shared_prefix)
        prompts = factory.prompts(cell.prompt_count)
        bodies = [_body(sweep, cell, p, cell.max_output) for p in prompts]
        warm = _body(sweep, cell, factory.prompt(WARM_INDEX), 1) if cell.shared_prefix else b""
    except (SpeedmatrixError, ValueError) as exc:
        return _failed(sweep, cell, exc)
    client = sweep.target.client(_CLIENT_TIMEOUT_S)
    if warm and (note := warm_prefix(client, sweep.target.endpoint(cell.api), warm)):
        sweep._note(note)
    before = read_counters(client, sweep.target.metrics_url)
    spec = sweep._spec(cell, cell.concurrency, bodies, [], cell.duration_s, cell.max_requests)
    sweep._decode_bounds(spec, cell)
    records = _run(sweep, spec)
    if records is None:
        return None
    after = read_counters(client, sweep.target.metrics_url)
    counters = {"before": before, "after": after} if before and after else None
    shape = dataclasses.replace(cell, cache_counters=counters)
    stored = sweep._judge_decode(shape, records, idle)
    return sweep._store_measured(stored, records, prompts)


def _interference(sweep: Any, cell: Any) -> Any:
    """N decoders from short prompts, then a cold C-token prompt every T seconds."""
    idle, _ = sweep._wait_idle()
    n, every, duration = int(cell.concurrency), float(cell.interference_every_s), cell.duration_s
    salt = f"{sweep.doc['meta']['run']['seed']}/{cell.id}/{sweep._nonce}"
    try:
        decoders = _factory(sweep, cell, DECODE_PROMPT_TOKENS, f"{salt}/decode").prompts(n)
        cold = _factory(sweep, cell, cell.context, f"{salt}/prefill")
        prefills = cold.prompts(interference.prefill_count(every, duration))
        bodies = [_body(sweep, cell, p, cell.max_output) for p in decoders]
        bodies += [_body(sweep, cell, p, 1) for p in prefills]
    except (SpeedmatrixError, ValueError) as exc:
        return _failed(sweep, cell, exc)
    spec = sweep._spec(cell, 1, bodies, [], duration)
    interference.configure(spec, n, every, duration)
    records = _run(sweep, spec)
    if records is None:
        return None
    return sweep._store_measured(interference_cell(cell, records, idle=idle), records, prefills)


def _trace_prompts(sweep: Any, cell: Any, trace: Any, salt: str) -> list[Any]:
    """A prompt per request of exactly its input tokens: its shared blocks first (the same
    token ids wherever a block recurs: `trace.shared_blocks`), else, for a request of a
    session (a conversation) after its first, the session's previous prompt (all of it the
    length allows: a turn carries the conversation so far), then its own salted tokens.
    Blocks and sessions need token-id prompts; with another method every prompt is unique."""
    factories: dict[int, PromptFactory] = {}
    blocks: dict[str, list[int]] = {}
    sessions: dict[str, list[int]] = {}  # a session's latest prompt, its ids
    prompts = []
    for i, r in enumerate(trace.requests):
        if r.input_tokens not in factories:
            factories[r.input_tokens] = _factory(sweep, cell, r.input_tokens, salt)
        own = factories[r.input_tokens].prompt(i)
        if own.method != "token_ids":
            prompts.append(own)
            continue
        n = len(own.payload)  # the ids; the server adds input_tokens - n of its own
        ids: list[int] = []
        spans = shared_blocks(r)
        for block, size in spans:
            if block not in blocks:
                made = _factory(sweep, cell, BLOCK_TOKENS + r.input_tokens - n, f"{salt}/b/{block}")
                blocks[block] = cast(list[int], made.prompt(0).payload)
            ids += blocks[block][:size]
        if not spans and r.session is not None:
            ids = sessions.get(r.session, [])[: n - 1]  # at least one token of its own
        ids = ids[:n] + cast(list[int], own.payload)[: n - min(len(ids), n)]
        if r.session is not None:
            sessions[r.session] = ids
        prompts.append(own if ids == own.payload else dataclasses.replace(own, payload=ids))
    return prompts


def _trace(sweep: Any, cell: Any) -> Any:
    """The trace's requests at their arrival times / the speed-up, each with its own prompt
    and output length."""
    idle, _ = sweep._wait_idle()
    salt = f"{sweep.doc['meta']['run']['seed']}/{cell.id}/{sweep._nonce}"
    try:
        trace = load_trace(cell.trace)
        prompts = _trace_prompts(sweep, cell, trace, salt)
        bodies = [_body(sweep, cell, p, r.output_tokens) for p, r in zip(prompts, trace.requests)]
    except (SpeedmatrixError, ValueError) as exc:
        return _failed(sweep, cell, exc)
    spec = sweep._spec(cell, 1, bodies, [], cell.duration_s)
    spec.mode = "open"
    spec.schedule_ns = schedule_ns(trace, cell.speedup)
    spec.rate_per_s = float(cell.rate_per_s)
    spec.max_concurrency = int(cell.concurrency)
    spec.drain_timeout_s = float(cell.drain_timeout_s)
    records = _run(sweep, spec)
    if records is None:
        return None
    stored = sweep._judge_decode(cell, records, idle)
    return sweep._store_measured(stored, records, prompts)


def _conversations(sweep: Any, cell: Any) -> tuple[sessions.Chat, list[Any]]:
    """The cell's chat (each session's id pool: its last turn's prompt, exactly) and the pool
    prompts (for the stored cell's prompt method)."""
    turns, step, out_tokens = cell.sessions, cell.turn_tokens, cell.max_output
    last = sessions.final_tokens(cell.context, step, out_tokens, turns)
    salt = f"{sweep.doc['meta']['run']['seed']}/{cell.id}/{sweep._nonce}"
    full = _factory(sweep, cell, last, salt).prompts(cell.concurrency)
    if full[0].method != "token_ids":
        raise PromptError(
            "sessions need token-id prompts (the completions API of an engine that takes "
            f"them) so that each turn's prompt is a prefix of the next; this server: {full[0].method}"
        )
    overhead = last - len(full[0].payload)
    pools = [list(cast(list[int], p.payload)) for p in full]
    chat = sessions.Chat(pools, cell.context - overhead, overhead, out_tokens, step, turns)
    return chat, full


def _answer_sources(sweep: Any) -> dict[str, Any]:
    """The ways to an answer's ids besides the stream (`sessions.answer_of`): the server's
    tokenize endpoint and the local tokenizer, where there are."""
    out: dict[str, Any] = {}
    tok = sweep.target.tokenize
    if tok is not None:
        client = sweep.target.client(_CLIENT_TIMEOUT_S)
        out["tokenize"] = lambda text: tok.ids(client, sweep.target.model, text)
    if sweep.tokenizer is not None:
        out["tokenizer"] = lambda text: local_ids(sweep.tokenizer, text)
    return out


def _sessions(sweep: Any, cell: Any) -> Any:
    """Free-running sessions: one cell whose core sends each session's next turn at its own
    answer's end + the think time (a `_core.ChainFeed`), the bodies built by
    `sessions.run_feeder` on a thread beside it; bounded by T x the cell's duration."""
    idle, _ = sweep._wait_idle()
    try:
        chat, made = _conversations(sweep, cell)
    except (SpeedmatrixError, ValueError) as exc:
        return _failed(sweep, cell, exc)
    extra = dict(cell.extra or {})
    field = get_adapter(sweep.target.engine).answer_ids_field
    if field:
        extra[field] = True  # the engine streams the answer's ids on request

    def body_of(session: int, ids: list[int]) -> bytes:
        return request_body(sweep.target, cell.api, ids, cell.max_output, extra=extra)

    n, turns = int(cell.concurrency), int(cell.sessions)
    spec = sweep._spec(
        cell,
        n,
        [body_of(s, ids) for s, ids in enumerate(chat.prompts)],
        [],
        turns * cell.duration_s,
    )
    spec.steady_window = False
    spec.keep_output = True
    feed = _core.ChainFeed(n, turns, float(cell.think_time_s))
    spec.chain = feed
    feeder = threading.Thread(
        target=sessions.run_feeder,
        args=(feed, chat, body_of, _answer_sources(sweep)),
        name="speedmatrix-session-feeder",
        daemon=True,
    )
    feeder.start()
    try:
        res, interrupted = sweep._run_spec(spec)
    finally:
        feed.close()  # the core closed it; again here in case it never ran
        feeder.join()
    if interrupted:
        sweep.interrupted = True
        return None
    records = Records.from_result(res)
    req = records.requests
    req.update(sessions.turn_columns(req["body"], chat, feed.ready_ns()))
    stored = session_cell(cell, records, idle=idle)
    return sweep._store_measured(stored, records, made)
