"""`speedmatrix predict`: a profile's decode matrix from the engine model, without load."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `predict` command."""
    p = sub.add_parser(
        "predict",
        help="predict a decode matrix from an engine profile (no load sent)",
        description="Evaluates the built-in engine's model for every (context, concurrency) "
        "decode cell of a profile (shipped, or fitted by `speedmatrix fit`); every figure is "
        "predicted, never measured, with its interval (docs/metrics.md, Predicted cells).",
        epilog="examples:\n  speedmatrix predict seed-h200 --contexts 8K,64K "
        "--concurrency 1,16,64 --set kv_tokens=2x\n"
        "  speedmatrix predict h200.json --contexts 8K,max --concurrency 1,64 --out out/pred\n",
        formatter_class=Formatter,
    )
    p.add_argument("profile", help="a shipped profile name or a .json path")
    p.add_argument("--contexts", required=True, help="context lengths, e.g. 8K,16K,max")
    p.add_argument("--concurrency", required=True, help="concurrency levels, e.g. 1,2,4")
    p.add_argument(
        "--max-output",
        type=int,
        default=None,
        help="tokens each request may make (default: the fitted run's, else 4096)",
    )
    p.add_argument(
        "--window",
        type=float,
        default=None,
        help="window seconds (default: the fitted run's, else 30)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="what-if: VALUE or Nx"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per cell")
    p.add_argument(
        "--out", type=Path, help="also write a run folder (run.json) of the predicted cells"
    )


def command(args: argparse.Namespace) -> int:
    from speedmatrix.twin.commands import predict_command  # start-up: numpy, pandas (--help)

    return predict_command(args)
