"""What every part of a `Sweep` shares: its state, the outcome of a cell, and the names
of what `--resume` keeps and redoes.

`Sweep` is built in layers, each a module of one concern and each reading only the layers
below it: `state` -> `store` (run.json) -> `server` (idle wait, a lost server) ->
`prompting` (prompts and bodies) -> `measure` (one cell through the core) -> `search`
(the SLO search) -> `runner` (the run's order of cells). `SweepState` names the
attributes `runner.Sweep.__init__` sets, so that each layer is typed on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speedmatrix.http import ClientConfig
    from speedmatrix.plan import PlannedCell
    from speedmatrix.progress import Progress
    from speedmatrix.verdict import EngineFacts, Rules

#: statuses of saved cells that --resume keeps; every other cell is measured again
KEPT_ON_RESUME = ("valid", "queued", "over_capacity")
#: `not_run` of the cells left when the server stopped answering; `--resume` redoes them
SERVER_UNREACHABLE = "server_unreachable"


@dataclass
class CellOutcome:
    """What a measured cell adds to run.json."""

    cell: dict


class SweepState:
    """The attributes of a sweep (set by `speedmatrix.sweep.runner.Sweep.__init__`)."""

    #: how every request reaches the server (discovery, prompts, the core's streams)
    client: ClientConfig
    #: the server's base URL, credentials removed (they live in `client` only)
    url: str
    api_key: str | None
    model: str | None
    overrides: dict
    info: dict
    #: a resume continues on a server whose identity or limits changed (recorded)
    force: bool
    #: a short load probe may learn the running cap where the server does not say it
    probe_running: bool
    matrix: Any
    out: Path
    report: bool
    progress: Progress
    #: the discovered server (`speedmatrix.adapters.Target`); None until discovery
    target: Any
    #: run.json as it will be written; `cells` is its cells by id
    doc: dict
    cells: dict[str, dict]
    interrupted: bool
    #: why the server stopped answering mid-sweep (None while it answers)
    unreachable: str | None
    #: a local tokenizer for exact prompts: an object or a name/path to load
    tokenizer: Any
    facts: EngineFacts
    rules: Rules
    #: --ray: the shard pool each cell's load is dealt over (`speedmatrix.shards`); None:
    #: this process runs every cell
    shards: Any
    _nonce: str
    _cold_prompts: int
    #: notes of the cell being measured (the wait before it), saved in its ``notes``
    _cell_notes: list[str]
    #: (running, waiting) of a gauge that never read idle through a whole wait
    _stuck_load: tuple | None
    _secrets: Any
    #: decode cell id -> the prefill cell its N=1 warm-up measures (`Sweep._prefill_from_warmup`)
    _warmup_prefill: dict[str, str]
    #: every planned cell by id
    _planned: dict[str, PlannedCell]

    @staticmethod
    def _cell_time(cell) -> float:
        return float(cell.duration_s) if cell.phase in ("decode", "interference") else 0.0

    @staticmethod
    def _label(cell) -> str:
        if cell.phase == "prefill":
            return f"prefill {cell.label}"
        if cell.phase in ("interference", "session"):
            return f"{cell.phase} {cell.label} x {cell.concurrency}"
        if cell.cached_fraction is not None:
            return f"decode {cell.label} x {cell.concurrency} cached {cell.cached_fraction:g}"
        if cell.rate_per_s is not None:
            return f"decode {cell.label} @ {cell.rate_per_s:g}/s"
        return f"decode {cell.label} x {cell.concurrency}"
