"""Running a matrix: the orchestration of one sweep.

One `Sweep` measures one server with one `Matrix` (DESIGN.md, "Measurement
definitions"); per cell: plan -> prompts -> cell spec -> core (`_core.CellRunner`) ->
records (`speedmatrix.records.Records`) -> verdict (`speedmatrix.verdict`, pure) ->
store (`speedmatrix.runfile`). The terminal display is `speedmatrix.progress`, the run
metadata `speedmatrix.runmeta`. What it does:

* the target is probed once (`speedmatrix.adapters.discover`), the cells are
  planned (`speedmatrix.plan.plan`: over-capacity cells are never run);
* before every cell the server must be seen idle; a cell that starts on a busy
  server is flagged `busy_at_start`;
* a decode cell warms the prefix cache with its N prompts (max_tokens=1), then
  measures a closed-loop window of D seconds; at its end everything in flight is
  cancelled. The prefill figure of context C is the cold TTFT of the N=1 warm-up
  ("measured during decode warm-up"); contexts without such a cell get a
  standalone prefill cell (one cold request per repetition);
* a cell's figures, status and flags come from its raw records through
  `speedmatrix.verdict`, the same functions that recompute them from a saved run
  (`speedmatrix recompute`);
* `run.json` is rewritten atomically after every cell, so a crash or Ctrl-C loses
  at most the cell in progress, and `--resume` continues without redoing cells;
  the resolved plan (meta.run.plan) and the cells it will not run are written
  before the first cell;
* a cell whose prompts cannot be made is an `error` cell and the sweep goes on;
  before every cell after the first and after a cell with failed requests the
  server is asked whether it still answers; when it does not, the cells left are
  marked `error` ("server unreachable", `not_run`: `--resume` measures them) instead
  of each spending its window.

The modules, each one concern, each class reading only the layers below it:

* `state`: what every layer shares (`SweepState`, `CellOutcome`, what `--resume` keeps);
* `store`: run.json, each cell's records, the run's warnings and its end;
* `server`: the idle wait before a cell and the check that the server still answers;
* `prompting`: prompts and request bodies;
* `measure`: one cell through the core (`_core.CellRunner`) and the verdict;
* `search`: the SLO search (`--search`);
* `runner`: `Sweep`, the run's order: discovery, plan, each cell;
* `api`: `run` and `resume`.

Everything importable from `speedmatrix.sweep` before it became a package still is.
"""

from speedmatrix.sweep.api import resume, run
from speedmatrix.sweep.runner import Sweep
from speedmatrix.sweep.search import SEARCH_MAX_CELLS
from speedmatrix.sweep.server import (
    IDLE_READ_TIMEOUT_S,
    IDLE_SAY_AFTER_S,
    REPROBE_PAUSE_S,
    REPROBE_TRIES,
)
from speedmatrix.sweep.state import KEPT_ON_RESUME, SERVER_UNREACHABLE, CellOutcome

__all__ = [
    "IDLE_READ_TIMEOUT_S",
    "IDLE_SAY_AFTER_S",
    "KEPT_ON_RESUME",
    "REPROBE_PAUSE_S",
    "REPROBE_TRIES",
    "SEARCH_MAX_CELLS",
    "SERVER_UNREACHABLE",
    "CellOutcome",
    "Sweep",
    "resume",
    "run",
]
