"""`speedmatrix capacity`: per context, the largest measured load meeting an SLO."""

from __future__ import annotations

import argparse

from speedmatrix.cli.common import Formatter


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `capacity` command."""
    from speedmatrix.cli_load import add_capacity_parser

    add_capacity_parser(sub, Formatter)


def command(args: argparse.Namespace) -> int:
    from speedmatrix.cli_load import cmd_capacity

    return cmd_capacity(args)
