"""`speedmatrix predict`: a decode matrix from an engine profile, without sending load."""

from __future__ import annotations

import argparse

from speedmatrix.twin.commands import predict_command


def command(args: argparse.Namespace) -> int:
    return predict_command(args)
