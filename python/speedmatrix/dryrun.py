"""What a run will do, before it does it: ``speedmatrix run --dry-run`` and ``speedmatrix init``.

``describe(url, matrix)`` probes the server the way a run does (discovery: GET requests and the
engine's info endpoints, never a generation request), plans the matrix against what it found,
and returns the text a user reads before committing a GPU for an hour: every cell in run
order, the ones that will not run and why, how prompts will be made exact, and an estimated
duration from :func:`estimate_s`.

``estimate_s`` is the same model the live ETA uses. A decode cell's time is its warm-up (the
new prompt tokens it must prefill at the prefill rate, and the server admitting each new prompt),
its ramp (the server admitting the window's N requests, one after another, before they all
stream), its window, and a fixed overhead per cell (idle wait, cancellation, the cool-down before
a cold prefill). Prompts that share a prefix (``shared_prefix``) prefill only their own part once
the prefix is cached. An open-loop cell has no warm-up and no ramp: its time is its window.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import tomli_w

from speedmatrix.adapters import discover
from speedmatrix.matrix import Matrix
from speedmatrix.plan import plan
from speedmatrix.units import format_tokens

#: prompt tok/s assumed until a prefill has been measured (a mid-size model on one GPU)
ASSUMED_PREFILL_TOK_S = 10_000.0
#: seconds each cell spends outside its warm-up and window: the idle check before it,
#: cancelling the window's requests and waiting for the server to drain after it
CELL_OVERHEAD_S = 0.6
#: prompt tokens per second a server reads when it admits a request, cached or not (matching
#: the prefix cache, scheduling), one request after another: the N requests of a window reach
#: steady state only after N × C / this. SGLang on the seed report's H200 admits ~207K tok/s
#: (the seed-h200 profile's fitted front-end cost, 4.84 µs per prompt token), which makes a
#: 123K × 8 window's ramp ~5 s; docs/PERFORMANCE.md has the seed matrix's estimate and run.
ASSUMED_ADMIT_TOK_S = 200_000.0


def unique_prompt_tokens(context: int, shared_prefix: int) -> int:
    """Tokens of a prompt that are its own once another prompt of its cell is cached: all of
    them (``shared_prefix`` 0), all but the shared prefix (> 0), or the last ``|shared_prefix|``
    (< 0, "all but the last N shared")."""
    if shared_prefix > 0:
        return max(0, context - min(shared_prefix, context))
    if shared_prefix < 0:
        return min(-shared_prefix, context)
    return context


def _open_loop(c: Any) -> bool:
    return getattr(c, "rate_per_s", None) is not None


def _new_prompts(
    cells: list[Any], sent: dict[tuple[int, int], int] | None = None
) -> dict[str, tuple[int, bool]]:
    """New prompts each closed-loop decode cell's warm-up sends, and whether the first of
    them is the first prompt of its context and repetition (nothing of it cached yet): the
    decode cells of one context share their prompts (``Sweep._prompts``), so a cell sends only
    the prompts no earlier cell of that context and repetition sent. ``sent``: (context,
    repetition) -> prompts already sent (by the cells a run has finished)."""
    sent = dict(sent or {})
    out: dict[str, tuple[int, bool]] = {}
    for c in cells:
        if c.phase != "decode" or c.status is not None or _open_loop(c):
            continue
        key = (c.context, c.repetition)
        prev = sent.get(key, 0)
        out[c.id] = (max(0, c.concurrency - prev), prev == 0)
        sent[key] = max(prev, c.concurrency)
    return out


def _prompt_tokens_to_prefill(
    cells: list[Any], sent: dict[tuple[int, int], int] | None = None, shared_prefix: int = 0
) -> dict[str, int]:
    """New prompt tokens each decode cell's warm-up prefills (see :func:`_new_prompts`): the
    first prompt of a context in full, each further new prompt its own part
    (:func:`unique_prompt_tokens`)."""
    out: dict[str, int] = {}
    by_id = {c.id: c for c in cells}
    for cid, (n, first) in _new_prompts(cells, sent).items():
        ctx = by_id[cid].context
        if n == 0:
            out[cid] = 0
            continue
        own = unique_prompt_tokens(ctx, shared_prefix)
        out[cid] = (ctx if first else own) + (n - 1) * own
    return out


def cell_duration_s(c: Any, matrix: Matrix, shortest: bool = False) -> float:
    """A decode cell's window: its own (a plan may set one per cell) or the matrix's.
    ``shortest``: the least it can be, the precision stop's ``min_duration_s`` where a
    closed-loop window has a precision target (it ends between that and its cap)."""
    d = float(getattr(c, "duration_s", None) or matrix.duration_s)
    if shortest and matrix.precision > 0 and c.phase == "decode" and not _open_loop(c):
        return min(d, float(matrix.min_duration_s))
    return d


def estimate_cells_s(
    cells: list[Any],
    matrix: Matrix,
    prefill_tok_s: float | None = None,
    from_warmup: set[str] | None = None,
    sent: dict[tuple[int, int], int] | None = None,
    shortest: bool = False,
) -> list[float]:
    """Seconds each of the runnable ``cells`` (PlannedCell, in run order) will take; 0 for
    a cell that will not run or whose prefill a decode warm-up measures.

    ``prefill_tok_s``: the server's prompt tok/s where measured (else ASSUMED_PREFILL_TOK_S);
    ``from_warmup``: ids of prefill cells measured during a decode warm-up (no time of their
    own); ``sent``: prompts already sent per (context, repetition), see
    :func:`_prompt_tokens_to_prefill`; ``shortest``: with windows a precision target ends
    at their shortest (see :func:`cell_duration_s`). Cells already run are simply left out
    of ``cells``."""
    rate = float(prefill_tok_s or ASSUMED_PREFILL_TOK_S)
    shared = int(getattr(matrix, "shared_prefix", 0) or 0)
    new_tokens = _prompt_tokens_to_prefill(cells, sent, shared)
    new_prompts = _new_prompts(cells, sent)
    times = []
    for c in cells:
        t = 0.0
        if c.status is None and c.phase == "prefill":
            if not (from_warmup and c.id in from_warmup):
                t = c.context / rate + float(matrix.prefill_cooldown_s) + CELL_OVERHEAD_S
        elif c.status is None and _open_loop(c):
            t = cell_duration_s(c, matrix, shortest) + CELL_OVERHEAD_S
        elif c.status is None:
            admit_s = c.context / ASSUMED_ADMIT_TOK_S  # per request, cached or not
            prefill_s = new_tokens.get(c.id, c.concurrency * c.context) / rate
            n_new = new_prompts.get(c.id, (c.concurrency, True))[0]
            # with a warm-up the new prompts are prefilled (and admitted) before the window's
            # requests are sent; without one the window's ramp pays their prefill
            warm = prefill_s + n_new * admit_s if matrix.warmup else 0.0
            ramp = c.concurrency * admit_s + (0.0 if matrix.warmup else prefill_s)
            t = warm + ramp + cell_duration_s(c, matrix, shortest) + CELL_OVERHEAD_S
        times.append(t)
    return times


def estimate_s(cells: list[Any], matrix: Matrix, **options: Any) -> float:
    """Seconds the runnable ``cells`` will take in all: :func:`estimate_cells_s` (whose
    keyword ``options`` these are) summed."""
    return float(sum(estimate_cells_s(cells, matrix, **options)))


def prefill_from_warmup(cells: list[Any], matrix: Matrix) -> set[str]:
    """Ids of the prefill cells a decode cell's N=1 warm-up measures (as the sweep does)."""
    if matrix.prefill_mode != "warmup":
        return set()
    n1 = {
        (c.context, c.repetition)
        for c in cells
        if c.phase == "decode"
        and c.concurrency == 1
        and c.status is None
        and c.rate_per_s is None
        and getattr(c, "cached_fraction", None) is None
    }
    return {c.id for c in cells if c.phase == "prefill" and (c.context, c.repetition) in n1}


def prompt_method(target: Any, api: str, tokenizer: Any = None) -> str:
    """How prompts will be made exact, decided from discovery alone (the run confirms it
    with one 1-token request where noted; the dry run sends none)."""
    if api == "completions" and getattr(target, "token_id_prompts", False):
        return (
            "token_ids: prompts are lists of token ids, exact by construction "
            "(one 1-token request at the start of the run confirms the server takes them)"
        )
    if tokenizer is not None:
        return f"tokenizer: counted by the local tokenizer {tokenizer}"
    tok = getattr(target, "tokenize", None)
    if tok is not None and (api == "completions" or getattr(tok, "messages", False)):
        return f"tokenize: text counted by the server's {tok.path} endpoint until exact"
    return (
        "usage: no way to count tokens; two 1-token requests learn tokens per word, "
        "and every request's usage.prompt_tokens is checked (lengths unverified)"
    )


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _cell_rows(planned: Any, matrix: Matrix, from_warmup: set[str]) -> list[str]:
    """The plan's table: every cell in run order, numbered when it will run, with the
    status known before any request and why."""
    rows: list[str] = []
    rows.append(f"  {'#':>3}  {'cell':<26} {'status known now':<18} note")
    k = 0
    for c in planned:
        if c.phase == "prefill":
            name = f"prefill {c.label}"
        else:
            name = f"{c.phase} {c.label} × {c.concurrency}"
            if _open_loop(c):  # an open-loop cell's load is its rate (concurrency: the gate)
                name = f"decode {c.label} @ {c.rate_per_s:g} req/s"
            if getattr(c, "cached_fraction", None) is not None:
                name += f" cached {c.cached_fraction:g}"
        if matrix.repetitions > 1:
            name += f" (rep {c.repetition + 1})"
        if c.status is None:
            k += 1
            num = str(k)
            status = "queued (expected)" if c.expect_queued else "to run"
            note = ""
            if c.id in from_warmup:
                status, note = "to run", "measured during the 1-request decode warm-up"
                num = "-"
                k -= 1
            elif c.expect_queued:
                note = f"above the server's running cap of {planned.max_running}"
        else:
            num = "-"
            status = c.status.replace("_", " ")
            note = c.reason or ""
        rows.append(f"  {num:>3}  {name:<26} {status:<18} {note}".rstrip())
    return rows


def describe(
    url: str,
    matrix: Matrix,
    *,
    api_key: str | None = None,
    model: str | None = None,
    overrides: dict | None = None,
    tokenizer: Any = None,
    target: Any = None,
    sources: dict[str, str] | None = None,
    client: Any = None,
) -> str:
    """The dry run's text: target, the settings in force (and where each came from:
    ``sources``, field -> "default" / "file NAME" / the flag), plan, statuses known in
    advance, prompts, duration."""
    if target is None:
        target = discover(
            url, api_key=api_key, model=model, overrides=overrides or {}, client=client
        )
    planned = plan(matrix, target)
    engine = target.engine_name or target.engine
    lines = [
        f"Target: {target.url} · {engine}"
        + (f" {target.version}" if target.version else "")
        + f" · model {target.model or '?'} · {matrix.api} API",
        "Capacity: "
        + ", ".join(
            f"{name} {format_tokens(v) if isinstance(v, int) and name != 'max running' else v}"
            for name, v in (
                ("KV cache", planned.kv_tokens),
                ("context length", planned.context_length),
                ("max running", planned.max_running),
            )
            if v is not None
        )
        if any(v is not None for v in (planned.kv_tokens, planned.context_length))
        else "Capacity: not known (see warnings)",
    ]
    lines += settings_lines(matrix, sources)
    from_warmup = prefill_from_warmup(planned, matrix)
    runnable = [c for c in planned if c.status is None]
    n_dec = len([c for c in runnable if c.phase != "prefill"])
    n_pre = len(runnable) - n_dec
    lines.append(
        f"Plan: {len(planned)} cells: {n_dec} decode of {_duration(matrix.duration_s)} each, "
        f"{n_pre} prefill ({len(from_warmup)} of them during a decode warm-up); "
        f"{len(planned) - len(runnable)} will not run"
    )
    lines.append("")
    lines += _cell_rows(planned, matrix, from_warmup)
    lines.append("")
    lines.append(f"Prompts: {prompt_method(target, matrix.api, tokenizer)}")
    lines.append(_estimate_line(planned, runnable, matrix, from_warmup))
    warnings = list(target.warnings) + list(planned.warnings)
    for w in warnings:
        lines.append(f"Warning: {w}")
    lines.append("No generation request was sent. Drop --dry-run to measure.")
    return "\n".join(lines)


def _estimate_line(planned: Any, runnable: list[Any], matrix: Matrix, from_warmup: set[str]) -> str:
    """The estimated duration; with a precision target, a range: every window ending at
    its shortest (min_duration_s) to every window running to its cap (duration_s)."""
    est = estimate_s(planned, matrix, from_warmup=from_warmup)
    windows = sum(cell_duration_s(c, matrix) for c in runnable if c.phase == "decode")
    total, win = _duration(est), _duration(windows)
    if matrix.precision > 0:
        low = estimate_s(planned, matrix, from_warmup=from_warmup, shortest=True)
        low_win = sum(cell_duration_s(c, matrix, True) for c in runnable if c.phase == "decode")
        total = f"{_duration(low)} to {total}"
        win = (
            f"{_duration(low_win)} to {win}: precision {matrix.precision:.3g} ends each "
            f"window between {_duration(min(matrix.min_duration_s, matrix.duration_s))} and "
            f"{_duration(matrix.duration_s)}"
        )
    return (
        f"Estimated duration: {total} (windows {win}; "
        f"warm-ups and prefill at an assumed {ASSUMED_PREFILL_TOK_S:,.0f} prompt tok/s, "
        f"ramps at {ASSUMED_ADMIT_TOK_S:,.0f} prompt tok/s admitted; "
        "the live ETA corrects it from the first measured prefill)"
    )


def _setting_text(value: Any) -> str:
    if isinstance(value, list):
        return (
            ", ".join(
                format_tokens(v)
                if isinstance(v, int)
                else f"{v:g}"
                if isinstance(v, float)
                else str(v)
                for v in value
            )
            or "none"
        )
    if isinstance(value, dict):
        return (
            ", ".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items()
            )
            or "none"
        )
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if value == "" else str(value)


def settings_lines(matrix: Matrix, sources: dict[str, str] | None = None) -> list[str]:
    """Every matrix setting in force, one a line, with where it came from (``sources``:
    field -> "default", "preset seed", "file m.toml", "--precision"; "given" without)."""
    data = matrix.to_dict()
    width = max(len(k) for k in data)
    lines = ["Settings (value, from where):"]
    for key, value in data.items():
        text = _setting_text(value)
        if len(text) > 60:
            text = text[:57] + "..."
        where = (sources or {}).get(key, "given")
        lines.append(f"  {key:<{width}}  {text:<24} {where}".rstrip())
    return lines


_FIELD_HELP = {
    "contexts": 'decode contexts in tokens (8192 or "8k"); "max" = the longest that fits '
    "the server's context length with max_output",
    "concurrency": "requests at once in each decode cell",
    "duration_s": "seconds of the measured window of each decode cell",
    "max_output": "max output tokens per request (the server is told to ignore end-of-sequence)",
    "prefill_contexts": "contexts of the prefill cells (cold TTFT of one prompt); "
    '"max-decode" = the decode max, "max" = the longest prompt the server takes; [] = none',
    "api": '"completions" or "chat"',
    "shared_prefix": "tokens every prompt of a cell shares at its start (0 = all unique; "
    "negative = all but the last |n|)",
    "repetitions": "how many times each cell is measured",
    "warmup": "warm the prompt cache before each window (TTFT then mostly excludes prefill)",
    "idle_timeout_s": "seconds to wait for the server to be idle before a cell",
    "error_threshold": "a cell whose failed requests exceed this share is an error",
    "prefill_mode": '"warmup" (prefill from the 1-request decode warm-up, as the seed) or '
    '"separate"',
    "request_idle_timeout_s": "seconds a request may receive nothing before it is cancelled",
    "prefill_cooldown_s": "seconds of quiet before a cold prefill measurement",
    "request_rates": "open loop: arrival rates in requests/s; when given, the decode cells are "
    "contexts × rates instead of × concurrency ([] = closed loop)",
    "arrival": 'open loop: "poisson", "constant" or "gamma:SHAPE" (1 = Poisson, < 1 burstier)',
    "max_concurrency": "open loop: at most this many requests in flight, the rest wait at "
    "the client (0 = no gate)",
    "drain_timeout_s": "open loop: seconds the window's requests may take to finish after it",
    "percentiles": "latency percentiles reported for every cell",
    "slo": "per-request targets in ms, any of ttft, tpot, e2e, tbt, e.g. "
    "{ ttft = 2000.0, tpot = 50.0 }; {} = no SLO figures",
    "attainment": "share of requests that must meet the SLO for a load to pass",
    "search": '"concurrency" or "rate": instead of the grid, find per context the largest '
    'load meeting the SLO; "" = the grid',
    "prompts_file": "a workload file (JSONL or ShareGPT JSON) whose requests replace the "
    'synthetic prompts; "" = synthetic prompts',
    "precision": "end each decode window once the 95% intervals of total tok/s and median "
    "time between tokens are within this fraction (0.02 = 2%); 0 = fixed windows",
    "min_duration_s": "the shortest window a precision target may end (seconds)",
    "stall_min_s": "a request with no token for max(this, stall_gap_factor × the cell's "
    "median gap) seconds is cut as a stall (0 = off)",
    "stall_gap_factor": "see stall_min_s",
    "ramp_cap_s": "the longest ramp (seconds) before the window opens anyway (flag long_ramp)",
    "client_threads": "the client's event loops per cell: N, or 0 = auto (one per 256 "
    "streams, at most the cores minus one); the figures do not depend on it",
    "cached_fraction": "shares of each prompt served from a prefix the server has seen, e.g. "
    "[0.0, 0.5, 0.9]: the decode cells become contexts × concurrency × share ([] = none)",
    "interference_every_s": "instead of decode cells, N streams decode while one cold prompt "
    "of the context arrives this often (seconds; 0 = none)",
    "trace": "a trace to replay (JSONL, Mooncake JSONL or Azure CSV) instead of decode cells; "
    '"" = none',
    "speedup": "the trace's arrival times are divided by this (2 = twice as fast)",
    "sessions": "instead of decode cells, conversations of this many turns, concurrency of "
    "them at once, the first prompt of each context (0 = none)",
    "turn_tokens": "sessions: new user tokens each turn adds after the previous answer",
    "think_time_s": "sessions: seconds between a turn's end and the next turn",
    "plan": '"full" measures every cell; "sparse" measures a design, fits the built-in '
    "engine's profile and predicts the rest (cells marked predicted)",
    "sparse_target": "sparse: measure until every predicted interval's relative half-width "
    "is within this fraction",
    "sparse_max_cells": "sparse: the most decode cells measured (0 = 40% of the grid)",
}


def commented_toml(preset: str = "seed") -> str:
    """A matrix file to start from: the preset's values, each line explained, readable by
    ``Matrix.from_toml`` (``speedmatrix run --matrix FILE``)."""

    m = Matrix.preset(preset)
    data = m.to_dict()
    data.pop("extra", None)
    out = [
        f"# speedmatrix matrix definition (from the {preset!r} preset).",
        "# Use it with: speedmatrix run --url URL --matrix THIS_FILE --out DIR",
        "# Flags given on the command line override the values here.",
        "",
        "[matrix]",
    ]
    for key, value in data.items():
        if isinstance(value, list):  # one line: JSON numbers and strings are TOML too
            line = f"{key} = [{', '.join(json.dumps(v) for v in value)}]"
        elif isinstance(value, dict):
            # inline ({...}), never a [key] table: a table header would put every key
            # after it outside [matrix]
            items = ", ".join(tomli_w.dumps({k: v}).strip() for k, v in value.items())
            line = f"{key} = {{ {items} }}" if items else f"{key} = {{}}"
        else:
            line = tomli_w.dumps({key: value}).strip()
        out += textwrap.wrap(_FIELD_HELP[key], 88, initial_indent="# ", subsequent_indent="# ")
        out.append(line)
    out += [
        "",
        "# fields merged into every request body, e.g. sampling settings:",
        "# [matrix.extra]",
        "# temperature = 0.0",
        "",
    ]
    return "\n".join(out)
