"""`speedmatrix selftest`: the client's roofline on this host (speedmatrix.selftest)."""

from __future__ import annotations

import argparse
import json
import sys

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError, csv_list, positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `selftest` command."""
    p = sub.add_parser(
        "selftest",
        help="the client's own limits on this host (requests/s, events/s, delay)",
        description="Measure what the client can take in on this machine, for 1..N event "
        "loops, against the built-in engine: requests/s and SSE events/s unpaced, and the p99 "
        "delay from the engine's send to the client's read with streams in lockstep. The "
        "result is kept per host and copied into run.json by every run; a cell whose load "
        "needs more than half of it is flagged client_near_limit (docs/SCALE.md).",
        epilog="examples:\n  speedmatrix selftest\n  speedmatrix selftest --loops 1,2 "
        "--duration 3 --json\n",
        formatter_class=Formatter,
    )
    p.add_argument(
        "--loops",
        metavar="N,N",
        help="loop counts to measure (default: 1, 2, 4, ... up to the cores minus one)",
    )
    p.add_argument("--duration", type=float, default=2.0, help="window per cell, s")
    p.add_argument(
        "--streams", type=int, default=512, help="streams of the lockstep cell (default 512)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-save", action="store_true", help="do not keep it for later runs")


def command(args: argparse.Namespace) -> int:
    from speedmatrix import roofline, selftest  # the core and the engine: only for this command

    loops = [positive_int(x, "--loops") for x in csv_list(args.loops)] if args.loops else None
    if not args.duration > 0:
        raise UsageError("--duration: must be > 0 seconds")
    if args.streams < 1:
        raise UsageError("--streams: must be >= 1")
    say = None if args.json else (lambda line: print(line, file=sys.stderr))
    result = selftest.measure(loops, args.duration, args.streams, say=say)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(roofline.format_table(result))
    if not args.no_save:
        path = roofline.save(result)
        if not args.json:
            print(f"kept in {path}; runs on this host copy it into run.json")
    return 0
