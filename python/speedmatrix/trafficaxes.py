"""The matrix fields of issue 23's traffic shapes, checked: the prefix-cache axis
(``cached_fraction``), the prefill-interference cell (``interference_every_s``), trace
replay (``trace``, ``speedup``) and multi-turn sessions (``sessions``, ``turn_tokens``,
``think_time_s``). `speedmatrix.matrix.Matrix` holds the fields and calls
`coerce` and `problems`; `speedmatrix.trafficplan` plans their cells.

Each replaces the decode grid's closed-loop cells by its own kind, so none combines with
another, with request rates, a search or a workload file: such a matrix is refused in one
line naming both fields.
"""

from __future__ import annotations

import math
from typing import Any

from speedmatrix.matrixfile import coerce_float_list, parse_typed
from speedmatrix.prefixcache import parse_cached_fractions
from speedmatrix.units import parse_duration, parse_tokens

__all__ = ["MAX_SPEEDUP", "MAX_TURNS", "coerce", "kind", "load_modes", "problems"]

#: a replay faster than this is a typo (a trace of a day would last under a second)
MAX_SPEEDUP = 100_000.0
#: more turns than this is a typo
MAX_TURNS = 1_000


def coerce(m: Any) -> None:
    """The forms people type (``"0,0.5"``, ``"2s"``) into the fields' types, in place."""
    m.cached_fraction = coerce_float_list(m.cached_fraction)  # bad items kept for problems()
    parse_typed(
        m,
        {
            "interference_every_s": parse_duration,
            "think_time_s": parse_duration,
            "turn_tokens": parse_tokens,
        },
    )
    m.trace = str(m.trace or "")


def kind(m: Any) -> str:
    """Which traffic shape the matrix asks for: ``cached``, ``interference``, ``trace``,
    ``sessions`` or "" (none)."""
    if m.cached_fraction:
        return "cached"
    if m.interference_every_s:
        return "interference"
    if m.trace:
        return "trace"
    if m.sessions:
        return "sessions"
    return ""


def load_modes(m: Any) -> list[str]:
    """The settings of ``m`` that replace the closed-loop grid's load with their own (open
    loop, an SLO search, a workload file): none combines with a traffic shape or a sparse
    plan."""
    modes = (
        ("request_rates", bool(m.request_rates)),
        ("search", bool(m.search)),
        ("prompts_file", bool(m.prompts_file)),
    )
    return [name for name, on in modes if on]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _session_problems(m: Any) -> list[str]:
    errors: list[str] = []
    if not _whole(m.sessions) or not 0 <= m.sessions <= MAX_TURNS:
        errors.append(f"sessions: {m.sessions!r} is not a number of turns in [0, {MAX_TURNS}]")
    if not _whole(m.turn_tokens) or m.turn_tokens < 1:
        errors.append(f"turn_tokens: {m.turn_tokens!r} is not a positive token count")
    if not _number(m.think_time_s) or m.think_time_s < 0:
        errors.append(f"think_time_s: {m.think_time_s!r} is not a number of seconds >= 0")
    return errors


def problems(m: Any) -> list[str]:
    """Every problem of the traffic fields, one message each, starting with the field."""
    errors: list[str] = []
    fractions = m.cached_fraction
    if not isinstance(fractions, list) or not all(_number(f) for f in fractions):
        errors.append(f"cached_fraction: {fractions!r} is not a list of shares")
    elif fractions:
        try:
            parse_cached_fractions(",".join(repr(float(f)) for f in fractions))
        except ValueError as exc:
            errors.append(str(exc))
    every = m.interference_every_s
    if not _number(every) or every < 0:
        errors.append(f"interference_every_s: {every!r} is not a number of seconds >= 0")
    elif every and _number(m.duration_s) and every >= m.duration_s:
        errors.append(
            f"interference_every_s: {every:g} s leaves no prefill in the {m.duration_s:g} s window"
        )
    if not _number(m.speedup) or not 0 < m.speedup <= MAX_SPEEDUP:
        errors.append(f"speedup: {m.speedup!r} is not a number in (0, {MAX_SPEEDUP:g}]")
    elif m.speedup != 1.0 and not m.trace:
        errors.append("speedup: replays a trace; give trace (--trace FILE) too")
    errors += _session_problems(m)
    asked = [
        name
        for name, on in (
            ("cached_fraction", bool(m.cached_fraction)),
            ("interference_every_s", _number(every) and every > 0),
            ("trace", bool(m.trace)),
            ("sessions", _whole(m.sessions) and m.sessions > 0),
        )
        if on
    ]
    others = load_modes(m)
    if len(asked) > 1:
        errors.append(f"{asked[1]}: cannot be combined with {asked[0]} (each is its own run)")
    elif asked and others:
        errors.append(f"{asked[0]}: cannot be combined with {others[0]}")
    return errors
