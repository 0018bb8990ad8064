"""`speedmatrix selftest`: the client's roofline on this host (speedmatrix.selftest; its
parser is cli/parsers.py's add_selftest)."""

from __future__ import annotations

import argparse
import json
import sys

from speedmatrix import roofline, selftest
from speedmatrix.cliargs import UsageError, csv_list, positive_int


def command(args: argparse.Namespace) -> int:
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
