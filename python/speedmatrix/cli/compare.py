"""`speedmatrix compare`: two saved runs cell by cell."""

from __future__ import annotations

import argparse

from speedmatrix.cli.parsers import COMPARE_DIR
from speedmatrix.report.compare import write_compare


def command(args: argparse.Namespace) -> int:

    paths = write_compare(args.dir_a, args.dir_b, args.out or args.dir_b / COMPARE_DIR)
    for p in paths:
        print(f"wrote {p}")
    return 0
