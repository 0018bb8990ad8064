"""`speedmatrix report`: report.md and report.html of a saved run."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `report` command."""
    rep = sub.add_parser(
        "report",
        help="write report.md and report.html of a saved run",
        description="(Re)write DIR/report.md, DIR/report.html and DIR/plots/ from DIR/run.json "
        "and the saved records; run.json is checked against its schema first.",
        epilog="examples:\n  speedmatrix report out/h200\n"
        "  speedmatrix report out/h200 --slo ttft=2s,tpot=50ms --attainment 99%\n",
        formatter_class=Formatter,
    )
    rep.add_argument("dir", type=Path, help="folder of a saved run (holds run.json)")
    rep.add_argument(
        "--slo",
        metavar="TARGETS",
        help="judge the goodput grid and capacity answer against these targets (any of ttft, "
        "tpot, e2e, tbt) instead of the run's own --slo, e.g. ttft=2s,tpot=50ms",
    )
    rep.add_argument(
        "--attainment",
        metavar="SHARE",
        help="share of requests that must meet the SLO (default: the run's, else 95%%)",
    )


def command(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix.errors import SpeedmatrixError
    from speedmatrix.report import write_report
    from speedmatrix.runfile import RunFileError, run_lock
    from speedmatrix.slo import parse_attainment, parse_slo

    try:  # a malformed --slo or --attainment is a usage error before any work
        slo = parse_slo(args.slo) if args.slo else None
        attainment = parse_attainment(args.attainment) if args.attainment else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        with run_lock(args.dir, "report"):  # never beside a run or recompute writing it
            md, html = write_report(args.dir, slo=slo, attainment=attainment)
    except RunFileError as exc:  # not valid JSON, a missing field: one line, status 1
        raise SpeedmatrixError(str(exc)) from None
    print(f"wrote {md}\nwrote {html}")
    return 0
