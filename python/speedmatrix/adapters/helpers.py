"""Small parsers shared by adapters."""

from __future__ import annotations

import re
from typing import Any

_GIT_SUFFIX = re.compile(r"\+g([0-9a-f]{7,40})")


def split_version(text: str | None) -> tuple[str | None, str | None]:
    """(version, commit) from e.g. ``0.5.6.post3.dev9265+g05c584c44`` (commit 05c584c44);
    the version is kept whole."""
    if not text:
        return None, None
    match = _GIT_SUFFIX.search(text)
    return text, (match.group(1) if match else None)


def positive_int(value: Any) -> int | None:
    """``value`` as a positive int, else None (for probed fields that may be null/"None")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
        return number if number > 0 else None
    return None


def first_metric(
    samples: list[tuple[str, dict[str, str], float]] | None, *names: str
) -> str | None:
    """The first of ``names`` that occurs in samples."""
    if not samples:
        return None
    present = {n for n, _l, _v in samples}
    for name in names:
        if name in present:
            return name
    return None
