"""Every judgement of speedmatrix: a cell's status and flags, one status for repetitions,
whether an open loop kept up, a run's exit status, and how older saved runs are read.

Pure: no I/O (but reading an old run's records to infer its facts), no clock, no state.
The live sweep and a saved run (``speedmatrix recompute``) go through the same functions,
so every stored cell can be rebuilt from its raw records, the engine facts that matter
(`EngineFacts`) and the rules (`Rules`).

Inputs of a cell's verdict (all of them; nothing else is read):

* ``shape``: what the plan said about the cell (id, phase, context, label,
  concurrency, repetition): `CellShape` or anything with those attributes
  (`speedmatrix.plan.PlannedCell`);
* ``records``: `speedmatrix.records.Records` (requests, events, metrics and the
  cell's clock stamps);
* ``facts``: `EngineFacts` (whether the output length is forced, the metric names);
* ``rules``: `Rules` (the thresholds; defaults are today's);
* ``idle``: whether the server was seen idle before the cell (else ``busy_at_start``).

Modules: `names` (`Status`, `Flag` and their words), `rules` (`Rules`, `EngineFacts`),
`flags` (one pure function per flag rule, over `Evidence`), `status` (the status rule),
`refusal` (a refusal for lack of context/KV is over capacity),
`window` and `server` (what the records and the server's gauges say), `cells` (a cell's
stored form), `openloop` (kept up), `run` (repetitions, exit status), `upgrade` (older
runs).
"""

from __future__ import annotations

from speedmatrix.verdict.cells import (
    ERROR_EXAMPLE_CHARS,
    CellShape,
    base_cell,
    decode_cell,
    prefill_cell,
    prefill_rows,
    prompt_check,
    prompt_failure_cell,
    unrun_cell,
)
from speedmatrix.verdict.flags import FLAG_RULES, Evidence, flags_of
from speedmatrix.verdict.names import REPORTED, Flag, Status
from speedmatrix.verdict.openloop import kept_up
from speedmatrix.verdict.refusal import context_refusal, refused_for_capacity
from speedmatrix.verdict.rules import EngineFacts, Rules
from speedmatrix.verdict.run import (
    ExitStatus,
    combined_status,
    error_kind,
    exit_status,
    reported_flags,
)
from speedmatrix.verdict.server import held_waiting, server_view
from speedmatrix.verdict.status import decode_status, error_text
from speedmatrix.verdict.window import (
    client_queue_signal,
    first_wave_settled,
    first_wave_streamed,
    tokens_estimated,
    ttft_unserved,
    usage_mismatches,
    warmup_unfinished,
)

__all__ = [
    "ERROR_EXAMPLE_CHARS",
    "FLAG_RULES",
    "REPORTED",
    "CellShape",
    "EngineFacts",
    "Evidence",
    "ExitStatus",
    "Flag",
    "Rules",
    "Status",
    "base_cell",
    "client_queue_signal",
    "combined_status",
    "context_refusal",
    "decode_cell",
    "decode_status",
    "error_kind",
    "error_text",
    "exit_status",
    "first_wave_settled",
    "first_wave_streamed",
    "flags_of",
    "held_waiting",
    "kept_up",
    "prefill_cell",
    "prefill_rows",
    "prompt_check",
    "prompt_failure_cell",
    "refused_for_capacity",
    "reported_flags",
    "server_view",
    "tokens_estimated",
    "ttft_unserved",
    "unrun_cell",
    "usage_mismatches",
    "warmup_unfinished",
]
