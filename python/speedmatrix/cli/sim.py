"""`speedmatrix sim`: the built-in engine in the foreground."""

from __future__ import annotations

import argparse

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError
from speedmatrix.cliargs import port as port_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `sim` command."""
    sim = sub.add_parser(
        "sim",
        help="run the built-in engine in the foreground",
        description="The built-in engine (speedmatrix-sim): an OpenAI-compatible server "
        "modelled on a real one, to try speedmatrix without a GPU.",
        epilog="examples:\n  speedmatrix sim --port 8000\n"
        "  speedmatrix sim --profile fixed --fault-http500 0.05 --seed 1\n",
        formatter_class=Formatter,
    )
    sim.add_argument("--port", type=port_arg, default=8000, help="port to listen on")
    sim.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sim.add_argument(
        "--profile",
        default="seed-h200",
        help="engine profile: a shipped name (seed-h200, fixed, ...) or a .json path",
    )
    sim.add_argument(
        "--flavour",
        choices=["sglang", "vllm"],
        help="which engine's endpoints and metrics to imitate (default: the profile's)",
    )
    sim.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile field"
    )
    from speedmatrix.sim import add_engine_flags  # standard library only: cheap to import

    add_engine_flags(sim)  # --unpaced, --stamp, --fault-* P, --seed N


def command(args: argparse.Namespace) -> int:
    from speedmatrix import sim

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
