"""Parsing and formatting of token counts and durations.

Token counts use binary multiples: ``k`` = 1024 tokens, ``m`` = 1024 * 1024 tokens, so
``"8k"`` is 8192 and ``"128k"`` is 131072 (the convention of the seed report and of every
engine's context-length flag). Labels are formatted the way the seed report prints them:
``round(tokens / 1024)`` followed by ``K`` for counts of at least 1024, the plain number below.

Durations accept ``ms``, ``s``, ``m``, ``h`` and compound forms (``"1m30s"``); a bare number
means seconds.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "TOKEN_UNITS",
    "format_duration",
    "format_tokens",
    "parse_duration",
    "parse_token_list",
    "parse_tokens",
]

TOKEN_UNITS: dict[str, int] = {"": 1, "k": 1024, "m": 1024 * 1024}
_DURATION_UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

_NUMBER_UNIT = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)")


def parse_tokens(value: int | str) -> int:
    """Token count from ``8192``, ``"8192"``, ``"8k"``, ``"8K"``, ``"1.5k"`` or ``"1m"``.

    Raises ValueError naming the offending text for unknown units, negative or fractional
    results and text that is not a number; TypeError for values that are not text or numbers.
    """
    if isinstance(value, bool):
        raise TypeError(f"not a token count: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"token count must not be negative: {value}")
        return value
    if isinstance(value, float):
        if not value.is_integer() or value < 0:
            raise ValueError(f"token count must be a whole non-negative number: {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"not a token count: {value!r}")
    text = value.strip()
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ValueError(f"not a token count: {value!r} (expected e.g. 8192, 8k, 128K)")
    number, unit = match.groups()
    factor = TOKEN_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown unit {unit!r} in {value!r} (token counts take k = 1024 or m = 1024*1024)"
        )
    tokens = float(number) * factor
    if not tokens.is_integer():
        raise ValueError(f"{value!r} is not a whole number of tokens ({tokens:g})")
    return int(tokens)


def parse_token_list(
    value: str | list | tuple, *, keywords: tuple[str, ...] = (), keep_bad: bool = False
) -> list:
    """A comma-separated list (or a sequence) of token counts; the words in ``keywords`` (for
    example ``"max"``) are kept as lower-case strings. ``keep_bad``: an item that does not
    parse (or is not a string) is kept as given, for a check that names its field."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if not item:
                continue
            if item.lower() in keywords:
                out.append(item.lower())
                continue
        elif keep_bad:
            out.append(item)
            continue
        try:
            out.append(parse_tokens(item))
        except ValueError:
            if not keep_bad:
                raise
            out.append(item)
    return out


def parse_duration(value: float | str) -> float:
    """Seconds from ``30``, ``"30"``, ``"30s"``, ``"500ms"``, ``"2m"``, ``"1h"``, ``"1m30s"``."""
    if isinstance(value, bool):
        raise TypeError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"duration must be a finite non-negative number: {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise TypeError(f"not a duration: {value!r}")
    text = value.strip()
    if not text:
        raise ValueError("empty duration")
    pos = 0
    total = 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if not match:
            raise ValueError(f"not a duration: {value!r} (expected e.g. 30s, 500ms, 2m)")
        number, unit = match.groups()
        unit = unit.lower() or "s"
        factor = _DURATION_UNITS.get(unit)
        if factor is None:
            raise ValueError(f"unknown unit {unit!r} in {value!r} (durations take ms, s, m, h)")
        total += float(number) * factor
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return total


def format_tokens(tokens: int) -> str:
    """Seed-style label: ``8192 -> "8K"``, ``125952 -> "123K"``, ``131008 -> "128K"``,
    ``512 -> "512"``. Within 0.07 K of a whole K the label is that K (the seed's
    128K prefill column is 131008 tokens); otherwise one decimal, so neighbouring
    contexts never share a label (``1536 -> "1.5K"``)."""
    tokens = int(tokens)
    if abs(tokens) < 1024:
        return str(tokens)
    k = tokens / 1024
    whole = math.floor(k + 0.5)
    if abs(k - whole) <= 0.07:
        return f"{whole}K"
    return f"{k:.1f}K"


def format_duration(seconds: float) -> str:
    """Short text for a duration: ``"30s"``, ``"2m"``, ``"500ms"``, ``"1.5s"``."""
    seconds = float(seconds)
    if seconds < 1 and seconds != 0:
        return f"{seconds * 1000:g}ms"
    if seconds >= 60 and (seconds / 60).is_integer():
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"
