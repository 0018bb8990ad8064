"""`speedmatrix demo`: the built-in engine, the seed's matrix, a report."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `demo` command."""
    demo = sub.add_parser(
        "demo",
        help="built-in engine + the seed's matrix + report",
        description="Start the built-in engine, run the seed's matrix against it, and write "
        "the report: what a run looks like, in a few minutes, without a GPU.",
        epilog="examples:\n  speedmatrix demo\n  speedmatrix demo --out /tmp/demo --duration 2s\n",
        formatter_class=Formatter,
    )
    demo.add_argument(
        "--out", type=Path, default=Path("speedmatrix-demo"), help="output folder of the run"
    )
    demo.add_argument(
        "--duration",
        default="3s",
        help="window per decode cell (windows open at steady state; the seed used 30s)",
    )
    demo.add_argument("--quiet", action="store_true", help="no progress display")


def command(args: argparse.Namespace) -> int:
    from speedmatrix import demo

    return demo.main(out=args.out, duration=args.duration, progress=not args.quiet)
