"""`speedmatrix show`: a saved run's grid in the terminal."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `show` command."""
    show = sub.add_parser(
        "show",
        help="print a saved run's grid in the terminal",
        description="Print DIR's headline grid: total tok/s by context × concurrency (or "
        "request rate), with the status of every cell that has no figure, as the report's "
        "Sustained decode table.",
        epilog="examples:\n  speedmatrix show out/h200\n",
        formatter_class=Formatter,
    )
    show.add_argument("dir", type=Path, help="folder of a saved run (holds run.json)")


def command(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix.errors import SpeedmatrixError
    from speedmatrix.results import load
    from speedmatrix.runfile import RunFileError
    from speedmatrix.show import grid_text

    try:
        run = load(args.dir, strict=False)
    except RunFileError as exc:  # not valid JSON, a missing field: one line, status 1
        raise SpeedmatrixError(str(exc)) from None
    print(grid_text(run, where=str(args.dir)), end="")
    return 0
