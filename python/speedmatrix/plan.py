"""The ordered list of cells a sweep runs, with the cells it must not run already marked.

``plan(matrix, target)`` resolves the ``max`` contexts against the server's context length,
then lists the prefill cells followed by the decode cells (context by context, concurrency
by concurrency, repetitions innermost). A cell the server cannot hold is not dropped: it is
kept with a status and a reason, and the sweep moves on.

Rules (DESIGN.md "Status"):

- **over_capacity** — the engine family's capacity rule (capacity.py): a shared pool
  (SGLang, vLLM): min(N, max running) × (C + max_output) > KV capacity; llama.cpp split
  slots: C + max_output > the slot's cache; llama.cpp unified pool: min(N, slots) ×
  (C + max_output) > the pool; TGI/Ollama: C + max_output > the per-request cap. Prefill
  cells are N = 1 with one output token. Not run.
- **error** — the context does not fit the server's context length (decode:
  C + max_output > context length; prefill: C + 1 > context length), or ``max`` was asked
  for and the context length is unknown. Not run.
- KV capacity unknown (shared pool): no cell is marked over capacity and the plan carries a
  warning. ``Plan.capacity_model`` records the model, its values and their sources.

``max`` (safety margin rule):

- decode: ``context_length - max_output - margin``, margin = min(1024, context_length // 16)
  tokens (room for the chat template, a BOS and the server's own reserve), rounded down to a
  multiple of 1024 when at least 8192, else of 64. 131072 with 4096 output → 125952 ("123K").
- prefill: ``context_length - 64`` (one output token plus slack), rounded down to a multiple
  of 64. 131072 → 131008 ("128K").
- ``max-decode`` in the prefill contexts is the decode value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from speedmatrix import trafficaxes
from speedmatrix.adapters.running import learn_layout, learn_max_running
from speedmatrix.capacity import CapacityModel, model_for
from speedmatrix.matrix import Matrix
from speedmatrix.trafficplan import shape_traffic_cell, traffic_cells
from speedmatrix.units import format_tokens
from speedmatrix.verdict.cells import CellShape

__all__ = [
    "DECODE_MARGIN_MAX",
    "PREFILL_MARGIN",
    "Plan",
    "PlannedCell",
    "decode_max",
    "plan",
    "prefill_max",
]

DECODE_MARGIN_MAX = 1024
PREFILL_MARGIN = 64
#: output tokens of a prefill cell (the first token is what is timed)
PREFILL_OUTPUT = 1


#: the most prompts an open-loop cell makes (arrival k sends prompt k % count beyond it)
OPEN_LOOP_PROMPTS = 20_000


def decode_max(context_length: int, max_output: int) -> int:
    """The largest decode context that fits ``context_length`` with ``max_output`` and the
    safety margin; 0 when nothing fits."""
    margin = min(DECODE_MARGIN_MAX, context_length // 16)
    avail = context_length - max_output - margin
    if avail <= 0:
        return 0
    step = 1024 if avail >= 8192 else 64
    return max(0, avail // step * step)


def prefill_max(context_length: int) -> int:
    """The largest prefill context: ``context_length`` less PREFILL_MARGIN, a multiple of 64."""
    avail = context_length - PREFILL_MARGIN
    return max(0, avail // 64 * 64)


@dataclass
class PlannedCell:
    """One cell to measure (``status`` None) or not to run (``over_capacity`` / ``error``).

    Defaults are not written twice: a cell's shape takes the verdict's (`CellShape`, what a
    stored cell says about its plan), a run-wide setting the matrix's (`Matrix`)."""

    id: str
    phase: str  # "prefill" | "decode"
    context: int
    label: str
    concurrency: int
    repetition: int
    max_output: int
    #: what the matrix said: the token count, "max" or "max-decode"
    spec: int | str
    status: str | None = None
    reason: str | None = None
    #: tokens the cell needs in the KV cache: N × (C + output)
    kv_needed: int = 0
    #: N is above the server's running cap: the cell is expected to queue
    expect_queued: bool = False
    #: "measured": the capacity rule could not decide (max running unknown), so the cell
    #: is run and its verdict judges it from preemptions (`capacity_note` says why)
    capacity_check: str = CellShape.capacity_check
    capacity_note: str = ""
    #: for a "measured" cell: the share of the KV pool one prompt needs to be admitted
    kv_admit_share: float = CellShape.kv_admit_share
    #: the cell's time limit (s): a decode cell's measurement window; a prefill cell's
    #: bound on its one cold request
    duration_s: float = 0.0
    #: requests after which the cell ends (0 = none: the window decides)
    max_requests: int = 0
    #: prompts the cell sends, each of `context` tokens, the first `shared_prefix` of
    #: them shared (N for a decode cell, 1 for a prefill cell)
    prompt_count: int = 1
    shared_prefix: int = 0
    #: the prompts are sent once with max_tokens=1 before the window (prefix cache warm)
    warmup: bool = False
    #: open loop (a request-rate cell): arrivals per second, their law ("poisson",
    #: "constant", "gamma:SHAPE"), the client's in-flight gate (0 = none; `concurrency`
    #: holds it too) and how long the window's requests may take to finish after it
    rate_per_s: float | None = CellShape.rate_per_s
    arrival: str = CellShape.arrival
    drain_timeout_s: float = 0.0
    #: the cell sends a workload file's requests (matrix.prompts_file) instead of
    #: synthetic prompts of `context` tokens
    prompts_file: str = CellShape.prompts_file
    #: the rest of what the core and the verdict need to run and judge the cell, so
    #: that the sweep never reads the matrix to measure one (_shape fills them in):
    #: the endpoint, fields merged into every body, a request's silence limit, the stall
    #: rule, the precision stop, the ramp cap, the percentiles and SLO targets judged
    api: str = Matrix.api
    extra: dict[str, Any] = field(default_factory=dict)
    request_idle_timeout_s: float = Matrix.request_idle_timeout_s
    stall_min_s: float = Matrix.stall_min_s
    stall_gap_factor: float = Matrix.stall_gap_factor
    precision: float = Matrix.precision
    min_duration_s: float = Matrix.min_duration_s
    ramp_cap_s: float = Matrix.ramp_cap_s
    client_threads: int = Matrix.client_threads  #: the client's event loops (0: auto)
    percentiles: list[float] = field(default_factory=list)
    slo: dict[str, float] = field(default_factory=dict)
    #: issue 23's traffic shapes (`speedmatrix.trafficplan`): the share of each prompt
    #: served from a warmed prefix; one cold prefill every that many seconds (phase
    #: "interference"); the trace file replayed and its speed-up
    cached_fraction: float | None = CellShape.cached_fraction
    interference_every_s: float = CellShape.interference_every_s
    trace: str = CellShape.trace
    speedup: float = CellShape.speedup
    #: a sessions cell (phase "session"): turns, each turn's new tokens, the pause between
    sessions: int = CellShape.sessions
    turn_tokens: int = CellShape.turn_tokens
    think_time_s: float = CellShape.think_time_s
    #: a cached-fraction cell's counters read around its window (the sweep's, once run)
    cache_counters: dict[str, Any] | None = CellShape.cache_counters

    @property
    def runnable(self) -> bool:
        return self.status is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Plan(list):
    """A list of PlannedCell in run order, with ``warnings``, the resolved ``contexts`` /
    ``prefill_contexts`` and the capacity figures it was planned against."""

    def __init__(self, cells: Iterable[PlannedCell] = (), **attrs: Any) -> None:
        super().__init__(cells)
        self.warnings: list[str] = list(attrs.get("warnings", []))
        self.contexts: list[int] = list(attrs.get("contexts", []))
        self.prefill_contexts: list[int] = list(attrs.get("prefill_contexts", []))
        self.kv_tokens: int | None = attrs.get("kv_tokens")
        self.context_length: int | None = attrs.get("context_length")
        self.max_running: int | None = attrs.get("max_running")
        #: the capacity model used (CapacityModel.to_dict()): family, values, sources
        self.capacity_model: dict[str, Any] | None = attrs.get("capacity_model")
        #: the CapacityModel itself, for cells planned later (search_cell)
        self.model: CapacityModel | None = attrs.get("model")

    def runnable(self) -> list[PlannedCell]:
        return [c for c in self if c.runnable]

    def by_id(self) -> dict[str, PlannedCell]:
        return {c.id: c for c in self}

    def over_capacity(self) -> list[tuple[int, int]]:
        """(context, concurrency) of the decode cells marked over capacity."""
        return sorted(
            {
                (c.context, c.concurrency)
                for c in self
                if c.phase == "decode" and c.status == "over_capacity"
            }
        )


def plan(
    matrix: Matrix,
    target: Any = None,
    *,
    kv_tokens: int | None = None,
    context_length: int | None = None,
    max_running: int | None = None,
) -> Plan:
    """Plan ``matrix`` against ``target`` (a Target, or anything with ``kv_tokens``,
    ``context_length`` and ``max_running`` attributes); the keyword arguments, when given,
    replace the target's figures. Invalid matrices raise ValueError."""
    matrix.validate()
    kv = kv_tokens if kv_tokens is not None else getattr(target, "kv_tokens", None)
    ctx_len = (
        context_length if context_length is not None else getattr(target, "context_length", None)
    )
    cap = max_running if max_running is not None else getattr(target, "max_running", None)
    model = model_for(
        target, kv_tokens=kv_tokens, context_length=context_length, max_running=max_running
    )
    warnings: list[str] = []
    if model.note:
        warnings.append(model.note)
    if model.family == "unknown":
        warnings.append(
            "KV capacity unknown: no cell is marked over capacity; cells the server cannot "
            "hold will queue or fail (give --kv-capacity)"
        )
    if ctx_len is None:
        warnings.append(
            "context length unknown: contexts are not checked against it and 'max' cannot be "
            "resolved (give --context-length)"
        )

    dmax = decode_max(ctx_len, matrix.max_output) if ctx_len else None
    pmax = prefill_max(ctx_len) if ctx_len else None
    if ctx_len and dmax == 0:
        warnings.append(
            f"no decode context fits the context length {ctx_len} with max output "
            f"{matrix.max_output}"
        )

    cells: list[PlannedCell] = []
    prefill_resolved = _resolve(
        matrix.prefill_contexts, {"max": pmax, "max-decode": dmax}, "prefill_contexts", warnings
    )
    decode_resolved = _resolve(matrix.contexts, {"max": dmax}, "contexts", warnings)

    for spec, context in prefill_resolved:
        for r in range(matrix.repetitions):
            cells.append(_cell("prefill", spec, context, 1, r, PREFILL_OUTPUT, model, ctx_len, cap))
    kind = trafficaxes.kind(matrix)
    if kind:

        def make(spec: int | str, context: int, n: int, r: int) -> PlannedCell:
            return _cell("decode", spec, context, n, r, matrix.max_output, model, ctx_len, cap)

        cells += traffic_cells(matrix, kind, decode_resolved, make)
    elif not matrix.search:  # the sweep plans each searched load with search_cell as it goes
        cells += _decode_cells(matrix, decode_resolved, model, ctx_len, cap)
    for cell in cells:
        _shape(cell, matrix)
    return Plan(
        cells,
        warnings=warnings,
        contexts=[c for _s, c in decode_resolved if c],
        prefill_contexts=[c for _s, c in prefill_resolved if c],
        kv_tokens=kv,
        context_length=ctx_len,
        max_running=cap,
        capacity_model=model.to_dict(),
        model=model,
    )


def _decode_cells(
    matrix: Matrix,
    resolved: list[tuple[int | str, int]],
    model: CapacityModel,
    ctx_len: int | None,
    cap: int | None,
) -> list[PlannedCell]:
    """The decode cells, context by context: × concurrency, or × rate (open loop)."""
    out: list[PlannedCell] = []
    for spec, context in resolved:
        if matrix.request_rates:
            # Open loop: contexts x rates. The gate (if any) bounds what the KV cache must
            # hold; without one the schedule decides and no cell is refused beforehand.
            for rate in matrix.request_rates:
                for r in range(matrix.repetitions):
                    cell = _cell(
                        "decode",
                        spec,
                        context,
                        matrix.max_concurrency,
                        r,
                        matrix.max_output,
                        model,
                        ctx_len,
                        cap,
                    )
                    cell.id = rate_cell_id(context or spec, rate, r)
                    cell.rate_per_s = float(rate)
                    out.append(cell)
            continue
        for n in matrix.concurrency:
            for r in range(matrix.repetitions):
                out.append(
                    _cell("decode", spec, context, n, r, matrix.max_output, model, ctx_len, cap)
                )
    return out


#: a prefill cell's one cold request ends in this many seconds at most, or
#: context / PREFILL_SLOWEST_TOK_S when longer
PREFILL_LIMIT_S = 600.0
PREFILL_SLOWEST_TOK_S = 100.0


def _shape(cell: PlannedCell, matrix: Matrix) -> None:
    """Fills in what the sweep needs to run the cell, so that it never reads the matrix."""
    cell.api = matrix.api
    cell.extra = dict(matrix.extra)
    cell.request_idle_timeout_s = float(matrix.request_idle_timeout_s)
    cell.stall_min_s = float(matrix.stall_min_s)
    cell.stall_gap_factor = float(matrix.stall_gap_factor)
    cell.precision = float(matrix.precision)
    cell.min_duration_s = float(matrix.min_duration_s)
    cell.ramp_cap_s = float(matrix.ramp_cap_s)
    cell.client_threads = int(matrix.client_threads)
    cell.percentiles = [float(p) for p in matrix.percentiles]
    cell.slo = dict(matrix.slo)
    if cell.phase == "decode" and matrix.prompts_file:
        cell.prompts_file = str(matrix.prompts_file)
    cell.shared_prefix = matrix.shared_prefix_for(cell.context) if cell.context else 0
    if cell.phase == "decode" and cell.rate_per_s is not None:
        cell.duration_s = float(matrix.duration_s)
        # A prompt per arrival (Poisson's count stays under mean + 4 sd), so that no
        # request finds its prompt in the prefix cache; no warm-up, which would put them
        # there. Arrival k sends prompt k % count.
        mean = cell.rate_per_s * cell.duration_s
        cell.prompt_count = min(math.ceil(mean + 4 * math.sqrt(mean) + 8), OPEN_LOOP_PROMPTS)
        cell.warmup = False
        cell.arrival = matrix.arrival
        cell.drain_timeout_s = float(matrix.drain_timeout_s)
    elif cell.phase == "decode":
        cell.duration_s = float(matrix.duration_s)
        cell.prompt_count = int(cell.concurrency)
        cell.warmup = bool(matrix.warmup)
    else:
        cell.duration_s = max(PREFILL_LIMIT_S, cell.context / PREFILL_SLOWEST_TOK_S)
        cell.max_requests = 1
        cell.prompt_count = 1
    shape_traffic_cell(cell, matrix)


def search_cell(matrix: Matrix, planned: Plan, context: int, load: float, repetition: int = 0):
    """The decode cell a search measures at ``load`` (a concurrency, or a rate when
    ``matrix.search == "rate"``) for ``context``, planned and shaped as plan() would."""
    ctx_len, cap = planned.context_length, planned.max_running
    model = planned.model or model_for(
        None, kv_tokens=planned.kv_tokens, context_length=ctx_len, max_running=cap
    )
    if matrix.search == "rate":
        cell = _cell(
            "decode", context, context, matrix.max_concurrency, repetition, matrix.max_output,
            model, ctx_len, cap,
        )  # fmt: skip
        cell.id = rate_cell_id(context, load, repetition)
        cell.rate_per_s = float(load)
    else:
        cell = _cell(
            "decode", context, context, int(load), repetition, matrix.max_output, model, ctx_len,
            cap,
        )  # fmt: skip
    _shape(cell, matrix)
    return cell


def rate_cell_id(context: int | str, rate: float, repetition: int) -> str:
    """``decode-c8192-q2-r0``: the id of a request-rate cell (q for requests/s)."""
    where = f"c{context}" if isinstance(context, int) else str(context)
    return f"decode-{where}-q{rate:g}-r{repetition}"


def _resolve(
    specs: list[int | str], keywords: dict[str, int | None], name: str, warnings: list[str]
) -> list[tuple[int | str, int]]:
    """(spec, tokens) per distinct context; tokens 0 = could not be resolved."""
    out: list[tuple[int | str, int]] = []
    seen: dict[int, int | str] = {}
    for spec in specs:
        tokens = keywords.get(spec) if isinstance(spec, str) else spec
        tokens = int(tokens or 0)
        if tokens and tokens in seen:
            warnings.append(
                f"{name}: {spec!r} resolves to {tokens} tokens, the same as {seen[tokens]!r}; "
                "measured once"
            )
            continue
        if tokens:
            seen[tokens] = spec
        out.append((spec, tokens))
    return out


def _cell(
    phase: str,
    spec: int | str,
    context: int,
    n: int,
    r: int,
    output: int,
    model: CapacityModel,
    ctx_len: int | None,
    cap: int | None,
) -> PlannedCell:
    if context:
        cid = f"{phase}-c{context}-r{r}" if phase == "prefill" else f"decode-c{context}-n{n}-r{r}"
        label = format_tokens(context)
    else:
        cid = f"{phase}-{spec}-r{r}" if phase == "prefill" else f"decode-{spec}-n{n}-r{r}"
        label = str(spec)
    need = n * (context + output)
    cell = PlannedCell(cid, phase, context, label, n, r, output, spec, kv_needed=need)
    if not context:
        cell.status = "error"
        cell.reason = (
            f"context {spec!r} needs the server's context length, which was not found "
            "(give --context-length)"
            if ctx_len is None
            else f"context {spec!r}: nothing fits the context length {ctx_len} with "
            f"{output} output tokens"
        )
        return cell
    if ctx_len is not None and context + output > ctx_len:
        what = "max output" if phase == "decode" else "one output token"
        cell.status = "error"
        cell.reason = (
            f"context {context} + {what} {output} = {context + output} tokens exceeds the "
            f"server's context length {ctx_len}"
        )
        return cell
    fit = model.check(context, n, output)
    cell.kv_needed = fit.kv_needed
    if fit.status:
        cell.status = fit.status
        cell.reason = fit.reason
        return cell
    if fit.queued or (cap is not None and n > cap):
        cell.expect_queued = True
    if fit.judged:
        cell.capacity_check, cell.capacity_note = fit.judged, fit.reason
        cell.kv_admit_share = fit.admit_share
    return cell


def plan_learning_running(
    matrix: Any, target: Any, launch_command: str | None = None, probe: bool = True
) -> Any:
    """``plan(matrix, target)``; where some cell's capacity verdict depends on the
    running cap the server did not publish, the cap is learnt first (launch command, then
    a load probe of max N + 1 requests) and the matrix planned again."""
    learn_layout(target, launch_command)
    planned = plan(matrix, target)
    if not any(c.capacity_check == "measured" for c in planned):
        return planned
    most = max([int(c.concurrency) for c in planned] or [1])
    note = learn_max_running(target, launch_command, most + 1 if probe else 0)
    again = plan(matrix, target)
    if note:
        again.warnings.append(note)
    return again
