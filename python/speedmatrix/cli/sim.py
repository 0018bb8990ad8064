"""`speedmatrix sim`: the built-in engine in the foreground."""

from __future__ import annotations

import argparse

from speedmatrix import sim
from speedmatrix.cliargs import UsageError


def command(args: argparse.Namespace) -> int:

    argv = ["--port", str(args.port), "--host", args.host, "--profile", args.profile]
    if args.flavour:
        argv += ["--flavour", args.flavour]
    for kv in args.set:
        argv += ["--set", kv]
    try:
        argv += sim.engine_flag_args(args)  # sim.main takes them under the same names
    except sim.SimError as exc:  # fault shares that add up to more than 1
        raise UsageError(str(exc)) from None
    if args.api_key:
        argv += ["--api-key", args.api_key]
    return sim.main(argv)
