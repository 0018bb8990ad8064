"""Argument checks the command-line modules share (cli.py, cli_load.py and the built-in
engine's own command line in sim.py): each bad value is one line that names the flag."""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """A flag or argument is wrong; the message is one line."""


def csv_list(text: str) -> list[str]:
    """A comma-separated flag value as its non-empty items."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"empty list {text!r}")
    return items


def positive_int(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not an integer") from None
    if value <= 0:
        raise UsageError(f"{flag}: {value} is not a positive integer")
    return value


def port(text: str) -> int:
    """A TCP port from the command line (argparse type): 0 (pick one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0..65535)")
    return value
