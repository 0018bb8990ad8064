"""`speedmatrix capacity`: per context, the largest measured load meeting an SLO."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``speedmatrix capacity DIR --slo ... [--attainment 95%] [--json]``."""
    cap = sub.add_parser(
        "capacity",
        help="per context, the largest measured load meeting an SLO (judged from the records)",
        description="Per context: the largest measured concurrency (or request rate) whose "
        "requests meet every SLO target at the given attainment, the first that does not, "
        "and an interpolated estimate between them, judged from the saved records.",
        epilog="examples:\n  speedmatrix capacity results/h200 --slo ttft=2s,tpot=50ms\n"
        "  speedmatrix capacity results/h200 --slo e2e=60s --attainment 99% --json\n",
        formatter_class=Formatter,
    )
    cap.add_argument("dir", type=Path, help="a saved run (the folder holding run.json)")
    cap.add_argument(
        "--slo",
        required=True,
        metavar="TARGETS",
        help="per-request targets, any of ttft, tpot, e2e, tbt: e.g. ttft=2s,tpot=50ms",
    )
    cap.add_argument(
        "--attainment",
        default="95%",
        metavar="SHARE",
        help="share of requests that must meet the SLO (default 95%%)",
    )
    cap.add_argument("--json", action="store_true", help="print the answer as JSON")


def command(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix import slo
    from speedmatrix.results import load

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
