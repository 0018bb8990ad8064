"""Errors speedmatrix reports to its user as one line (the CLI exits 1)."""

from __future__ import annotations

import sys
import warnings
from typing import Any


class SpeedmatrixError(Exception):
    """A failure that is the target's or the environment's, not a bug."""


class TargetError(SpeedmatrixError):
    """The server cannot be reached, refuses us, or does not serve the model."""


#: the most characters of text from outside (a server's names, its messages) one line shows
MAX_SHOWN_CHARS = 300


def clip(text: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` on one line, at most about ``limit`` characters: what is cut is counted."""
    one = " ".join(str(text).split())
    if len(one) <= limit:
        return one
    return f"{one[:limit]}... ({len(one) - limit:,} characters more)"


def some_of(names: list[str], shown: int = 10, limit: int = MAX_SHOWN_CHARS) -> str:
    """The first ``shown`` of ``names`` joined by commas ("and N more" for the rest), each
    name and the whole clipped: a server listing 10,000 models is not echoed whole."""
    head = ", ".join(clip(n, 80) for n in names[:shown])
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return clip(head, limit) + more


def route_warnings(stream: Any = None) -> None:
    """Python warnings (numpy's, a library's deprecation) as one line each on ``stream``
    (stderr), said once per message, without the file path and source line Python adds:
    ``speedmatrix: warning: Mean of empty slice (RuntimeWarning)``."""

    seen: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = f"{clip(message, 200)} ({category.__name__})"
        if text in seen:
            return
        seen.add(text)
        out = file or stream or sys.stderr
        try:
            print(f"speedmatrix: warning: {text}", file=out, flush=True)
        except (OSError, ValueError):
            pass  # a closed stream: a warning never ends a run

    warnings.showwarning = show
