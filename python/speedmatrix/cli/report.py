"""`speedmatrix report`: report.md and report.html of a saved run."""

from __future__ import annotations

import argparse

from speedmatrix.cliargs import UsageError
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.report import write_report
from speedmatrix.runfile import RunFileError, run_lock
from speedmatrix.slo import parse_attainment, parse_slo


def command(args: argparse.Namespace) -> int:

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
