"""`speedmatrix fit`: the built-in engine's profile fitted to a measured run's raw records."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `fit` command."""
    p = sub.add_parser(
        "fit",
        help="fit the built-in engine's profile to a measured run (for sim and predict)",
        description="Fits the decode step (from the arrival gaps at each batch and context), "
        "the cold prefill (from warm-ups that ran alone) and the KV pool and limits (from "
        "discovery) to a saved run's raw records. The profile loads in `speedmatrix sim "
        "--profile` and `speedmatrix predict`; its `fit` section holds each parameter's "
        "standard deviation and the residuals (docs/metrics.md, Predicted cells).",
        epilog="example:\n  speedmatrix fit out/h200 -o h200.json\n"
        "  speedmatrix predict h200.json --contexts 8K,64K --concurrency 1,64 --out out/pred\n",
        formatter_class=Formatter,
    )
    p.add_argument("dir", type=Path, help="folder of a saved run (holds run.json and records/)")
    p.add_argument("-o", "--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument(
        "--base", help="a profile whose other fields (chunk budget, ...) the fitted one keeps"
    )


def command(args: argparse.Namespace) -> int:
    from speedmatrix.twin.commands import fit_command  # start-up: numpy, pandas (see --help)

    return fit_command(args)
