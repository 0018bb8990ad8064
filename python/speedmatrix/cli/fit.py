"""`speedmatrix fit`: the built-in engine's profile fitted to a measured run's raw records."""

from __future__ import annotations

import argparse

from speedmatrix.twin.commands import fit_command


def command(args: argparse.Namespace) -> int:
    return fit_command(args)
