"""The `speedmatrix` command line (the contract of DESIGN.md, plus flags).

    speedmatrix run --url URL --contexts 8k,16k --concurrency 1,2,4 --out DIR [--dry-run]
    speedmatrix init matrix.toml [--preset seed|quick]
    speedmatrix sim [--port P] [--profile NAME] [--flavour sglang|vllm] [--set KEY=VALUE]
                    [--unpaced] [--stamp] [--fault-http500 P] [--fault-malformed P]
                    [--fault-drop P] [--fault-stall P] [--seed N]
    speedmatrix demo [--out DIR]
    speedmatrix report DIR
    speedmatrix show DIR
    speedmatrix compare DIR_A DIR_B [--out DIR]
    speedmatrix capacity DIR --slo ttft=2s,tpot=50ms [--attainment 95%] [--json]

One module per command with its ``command(args)`` (run, init, sim, demo, report, show,
recompute, compare, capacity, predict), imported only when that command runs; the parsers
are apart and light, so that ``--help`` imports no numpy: ``run_flags`` holds run's
argument groups, ``parsers`` the other commands', ``common`` the exit statuses, the parser
classes and the API key, ``main`` the whole parser and ``main()``. The names below are
re-exported for tests and scripts (the run's helpers: ``speedmatrix.cli.run``).

Exit status (docs/RELIABILITY.md): 0 every runnable cell measured; 3 some cells failed
(status error) or were not run; 1 nothing was measured or the run could not start (a target
that cannot be reached, a folder that holds another run, a file that cannot be written);
2 bad flags, before any work starts; 130 / 143 / 129 interrupted by SIGINT / SIGTERM /
SIGHUP (the run is saved, marked interrupted, and the report written; a second signal exits
at once, run.json intact since every write is atomic). Every failure is one line on stderr,
redacted; --debug adds the traceback.
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin after each call; on a machine shared with the
# server under test they would steal its cores. Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from speedmatrix.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    STOP_SIGNALS,
    Formatter,
    Parser,
    api_key_of,
)
from speedmatrix.cli.main import COMMANDS, build_parser, main
from speedmatrix.cli.parsers import COMPARE_DIR
from speedmatrix.cli.run_flags import (
    MATRIX_FLAGS,
    META_KEYS,
    RUN_DEFAULTS,
    RUN_EPILOG,
    add_run_groups,
)
from speedmatrix.cliargs import UsageError

# the names the tests and scripts used when this was one module (cli.py)
_Parser = Parser
_Formatter = Formatter

__all__ = [
    "COMMANDS",
    "COMPARE_DIR",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "MATRIX_FLAGS",
    "META_KEYS",
    "RUN_DEFAULTS",
    "RUN_EPILOG",
    "STOP_SIGNALS",
    "Formatter",
    "Parser",
    "UsageError",
    "add_run_groups",
    "api_key_of",
    "build_parser",
    "main",
]
