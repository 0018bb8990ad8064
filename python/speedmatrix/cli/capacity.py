"""`speedmatrix capacity`: per context, the largest measured load meeting an SLO."""

from __future__ import annotations

import argparse
import json

from speedmatrix import slo
from speedmatrix.cliargs import UsageError
from speedmatrix.results import load


def command(args: argparse.Namespace) -> int:

    try:
        targets = slo.parse_slo(args.slo)
        share = slo.parse_attainment(args.attainment)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    run = load(args.dir, strict=False)
    caps = run.capacity(targets, share)
    if args.json:
        print(json.dumps({str(k): v for k, v in caps.items()}, indent=2))
    elif not caps:
        print("no measured decode cells with records in this run")
    else:
        print(slo.capacity_table(caps, targets, share), end="")
    return 0
