"""Argument checks the command-line modules share (the cli/ package and the built-in
engine's own command line in sim.py): each bad value is one line that names the flag."""

from __future__ import annotations

import argparse
import urllib.parse
from typing import TypeVar


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


def parse_client_threads(text: str) -> int:
    """``--client-threads``: ``auto`` (0) or a positive number of event loops."""
    if text.strip().lower() == "auto":
        return 0
    return positive_int(text.strip(), "--client-threads")


N = TypeVar("N", int, float)


def number_in(text: str, convert: type[N], low: N, high: N, kind: str, in_range: str) -> N:
    """An argparse value: `text` converted (else "is not `kind`") and in [low, high] (else "is
    not `in_range`"), each a one-line error."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text} is not {in_range}")
    return value


def port(text: str) -> int:
    """A TCP port from the command line (argparse type): 0 (pick one) to 65535."""
    return number_in(text, int, 0, 65535, "a port number", "a port number (0..65535)")


def base_url(text: str, flag: str = "--url") -> str:
    """The server's base URL, by one rule for a dry run and a real run alike: ``http://`` or
    ``https://``; ``host:port`` without a scheme is ``http://host:port`` (as discovery has
    always read it); any other scheme, or no host, is a usage error naming the flag."""

    raw = text.strip()
    url = raw if "://" in raw else "http://" + raw
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise UsageError(f"{flag} must start with http:// or https://, not {scheme}://")
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise UsageError(f"{flag}: the port is not a number from 0 to 65535") from None
    if not parts.hostname:
        raise UsageError(f"{flag}: the URL names no host (e.g. http://127.0.0.1:8000)")
    return url
