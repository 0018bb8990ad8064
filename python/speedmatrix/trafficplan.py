"""The cells of issue 23's traffic shapes (`speedmatrix.trafficaxes`), planned and shaped
as `speedmatrix.plan` plans the grid's. `plan.plan` calls `traffic_cells` in place of the
closed-loop decode cells when the matrix asks for a shape.

- **cached fraction** f: ``decode-c{C}-n{N}-f{f}-r{r}``, a closed-loop decode cell whose N
  prompts share their first ``shared_prefix_tokens(C, f)`` tokens with one prompt sent
  before the cell (the prefix is the cell's own: `speedmatrix.prefixcache.prefix_seed` of
  the run's seed and the cell id) and are otherwise unique; one request per slot
  (``max_requests`` = N: a refill would send its slot's prompt again, wholly cached) and no
  warm-up of the prompts themselves.
- **interference** every T s: ``interference-c{C}-n{N}-r{r}``, N streams decoding from
  prompts of `DECODE_PROMPT_TOKENS` while one unique C-token prompt (one output token)
  arrives every T s, from T on (`speedmatrix.interference`).
- **trace**: ``trace-r{r}``, one open-loop cell replaying the trace's arrivals divided by
  the speed-up, each request with its own prompt and output length (`speedmatrix.trace`).
- **sessions** of T turns: ``session-c{C}-n{N}-t{T}-r{r}`` (phase "session"), N
  conversations whose first prompt is C tokens (`speedmatrix.sessions`); planned against
  the capacity its last turn needs; ``duration_s`` bounds each turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speedmatrix.prefixcache import shared_prefix_tokens
from speedmatrix.sessions import final_tokens
from speedmatrix.trace import load_trace, schedule_ns
from speedmatrix.units import format_tokens

__all__ = [
    "DECODE_PROMPT_TOKENS",
    "cached_cell_id",
    "shape_traffic_cell",
    "trace_summary",
    "traffic_cells",
]

#: prompt tokens of an interference cell's decoding streams (the prefill under test is C)
DECODE_PROMPT_TOKENS = 128


def cached_cell_id(context: int | str, n: int, fraction: float, repetition: int) -> str:
    """``decode-c8192-n4-f0.5-r0``."""
    where = f"c{context}" if isinstance(context, int) else str(context)
    return f"decode-{where}-n{n}-f{fraction:g}-r{repetition}"


def trace_summary(path: str, speedup: float) -> dict[str, Any]:
    """What planning needs of a trace: its requests, the replay's length in seconds (the
    last arrival / speed-up), its mean rate and its median prompt length (the cell's
    context label). Raises `speedmatrix.trace.TraceError` (one line) on a bad file."""
    trace = load_trace(path)
    due = schedule_ns(trace, speedup)
    span_s = due[-1] / 1e9
    inputs = sorted(r.input_tokens for r in trace.requests)
    return {
        "requests": len(trace.requests),
        "span_s": span_s,
        "rate_per_s": len(due) / span_s if span_s > 0 else float(len(due)),
        "median_input": inputs[len(inputs) // 2],
        "bad_rows": trace.bad_rows,
    }


def traffic_cells(
    matrix: Any,
    kind: str,
    resolved: list[tuple[int | str, int]],
    make: Callable[[int | str, int, int, int], Any],
) -> list[Any]:
    """The decode-side cells of a traffic shape ``kind`` (`trafficaxes.kind`), in run order.
    ``make(spec, context, n, repetition)`` is plan's cell maker (capacity rule included)."""
    out: list[Any] = []
    reps = range(matrix.repetitions)
    if kind == "trace":
        info = trace_summary(matrix.trace, matrix.speedup)
        for r in reps:
            cell = make(info["median_input"], info["median_input"], matrix.max_concurrency, r)
            cell.id, cell.label = f"trace-r{r}", "trace"
            cell.status = cell.reason = None  # the schedule decides, as an ungated open loop
            cell.trace, cell.speedup = str(matrix.trace), float(matrix.speedup)
            cell.rate_per_s = float(info["rate_per_s"])
            out.append(cell)
        return out
    for spec, context in resolved:
        for n in matrix.concurrency:
            if kind == "sessions":
                out += [_session_cell(matrix, spec, context, n, r, make) for r in reps]
                continue
            if kind == "interference":
                for r in reps:
                    cell = make(spec, context, n, r)
                    cell.phase = "interference"
                    cell.id = cell.id.replace("decode-", "interference-", 1)
                    cell.interference_every_s = float(matrix.interference_every_s)
                    out.append(cell)
                continue
            for f in matrix.cached_fraction:
                for r in reps:
                    cell = make(spec, context, n, r)
                    cell.id = cached_cell_id(context or spec, n, f, r)
                    cell.cached_fraction = float(f)
                    out.append(cell)
    return out


def _session_cell(
    matrix: Any, spec: int | str, context: int, n: int, r: int, make: Callable[..., Any]
) -> Any:
    """A sessions cell, its capacity planned for its last turn's prompt."""
    turns, step = int(matrix.sessions), int(matrix.turn_tokens)
    last = final_tokens(context, step, matrix.max_output, turns) if context else 0
    cell = make(spec, last, n, r)
    cell.phase, cell.context = "session", context
    if context:
        cell.label = format_tokens(context)
    where = f"c{context}" if context else str(spec)
    cell.id = f"session-{where}-n{n}-t{turns}-r{r}"
    cell.sessions, cell.turn_tokens = turns, step
    cell.think_time_s = float(matrix.think_time_s)
    return cell


def shape_traffic_cell(cell: Any, matrix: Any) -> None:
    """The run shape of a traffic cell, after plan's own (`plan._shape`)."""
    if cell.cached_fraction is not None:
        cell.prompt_count = int(cell.concurrency)
        cell.max_requests = int(cell.concurrency)
        cell.warmup = False
        cell.shared_prefix = shared_prefix_tokens(cell.context, cell.cached_fraction)
    elif cell.phase == "interference":
        cell.duration_s = float(matrix.duration_s)
        cell.max_requests = 0
        cell.prompt_count = int(cell.concurrency)
        cell.warmup = False
        cell.shared_prefix = 0
    elif cell.phase == "session":
        cell.duration_s = float(matrix.duration_s)  # each turn's cap
        cell.max_requests = int(cell.concurrency)
        cell.prompt_count = int(cell.concurrency)
        cell.warmup = False
        cell.shared_prefix = 0
    elif cell.trace:
        info = trace_summary(cell.trace, cell.speedup)
        cell.duration_s = info["span_s"] + 1e-3  # the window reaches past the last arrival
        cell.prompt_count = int(info["requests"])
        cell.warmup = False
        cell.shared_prefix = 0
        cell.arrival = "trace"
        cell.drain_timeout_s = float(matrix.drain_timeout_s)
