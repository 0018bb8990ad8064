"""A saved run as an object: tidy frames for pandas work, the seed's matrix, records.

import speedmatrix as sm
run = sm.load("out/seed")
run.cells                      # one row per cell, every run.json field
run.table("total_tok_s")       # numbers: rows = context, columns = concurrency
run.status_table("total_tok_s") # the report's grid, with status text
run.requests                   # every request of every cell, times in ms from t0
run.tokens("decode-c8192-n4-r0")
sm.concat([run_a, run_b], ["before", "after"])

`Run` is one public object built in layers, a module each, each reading only those below:
`flatten` (a run.json cell as a row), `frames` (request frames, display), `base` (`RunBase`:
the document and its cells), `recorded` (`RunRecords`: raw records and their frames),
`tables` (`RunTables`: the matrix layout, prefill, capacity) and `saved` (`Run`, `load`,
`concat`). The derivations it uses live elsewhere (records, verdict, _core). Every name
importable from `speedmatrix.results` before it became a package still is.
"""

from speedmatrix.results.base import RunBase
from speedmatrix.results.flatten import (
    CI_FIGURES,
    FIGURE_ALIASES,
    NOT_MEASURED,
    OUTCOME_TEXT,
    PHASE_TEXT,
    STATUS_TEXT,
    flatten_cell,
    flatten_latency,
)
from speedmatrix.results.frames import CellsFrame
from speedmatrix.results.recorded import RunRecords
from speedmatrix.results.saved import CONCAT_FRAMES, Run, concat, load
from speedmatrix.results.tables import RunTables
from speedmatrix.verdict import combined_status

# the names these had while results was one module (tests import them)
_flatten_cell = flatten_cell
_flatten_latency = flatten_latency

__all__ = [
    "CI_FIGURES",
    "CONCAT_FRAMES",
    "FIGURE_ALIASES",
    "NOT_MEASURED",
    "OUTCOME_TEXT",
    "PHASE_TEXT",
    "STATUS_TEXT",
    "CellsFrame",
    "Run",
    "RunBase",
    "RunRecords",
    "RunTables",
    "combined_status",
    "concat",
    "flatten_cell",
    "flatten_latency",
    "load",
]
