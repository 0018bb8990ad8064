"""`speedmatrix compare`: two saved runs cell by cell."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `compare` command."""
    cmp_ = sub.add_parser(
        "compare",
        help="compare two saved runs",
        description="Compare two saved runs cell by cell (B against A): a cell differs where "
        "the 95% intervals do not overlap, else by Welch's test on per-second throughput.",
        epilog="examples:\n  speedmatrix compare out/before out/after\n",
        formatter_class=Formatter,
    )
    cmp_.add_argument("dir_a", type=Path, help="the baseline run (A)")
    cmp_.add_argument("dir_b", type=Path, help="the run compared with it (B)")
    cmp_.add_argument(
        "--out",
        type=Path,
        help="folder for compare.md/html/csv and its "
        "charts (default: DIR_B/compare, apart from DIR_B's own report)",
    )


#: where `compare` writes by default, inside DIR_B: its charts must not mix with DIR_B's own
COMPARE_DIR = "compare"


def command(args: argparse.Namespace) -> int:
    for d in (args.dir_a, args.dir_b):
        if not (d / "run.json").is_file():
            raise UsageError(f"{d} holds no run.json")
    from speedmatrix.report.compare import write_compare

    paths = write_compare(args.dir_a, args.dir_b, args.out or args.dir_b / COMPARE_DIR)
    for p in paths:
        print(f"wrote {p}")
    return 0
