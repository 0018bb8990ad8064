"""Number and label formatting exactly as the seed report writes them.

Every function takes ``None`` or NaN and returns the em dash ``"—"`` for it, so
callers never have to special-case missing figures.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from speedmatrix.units import format_tokens
from speedmatrix.values import missing

DASH = "—"

STATUS_TEXT = {
    "valid": "Valid",
    "queued": "Requests queued",
    "over_capacity": "Over capacity",
    "error": "Error",
}

PHASE_TEXT = {"prefill": "Prefill", "decode": "Sustained decode"}

QUEUED_LEGEND = (
    "Requests queued: the server could not run all requests at once, so some waited in a queue."
)
OVER_CAPACITY_LEGEND = (
    "Over capacity: not run because this many requests at this context would exceed the "
    "server's KV cache."
)
LEGEND = f"{QUEUED_LEGEND} {OVER_CAPACITY_LEGEND}"
FLAG_MARK = "⚑"
FLAGGED_LEGEND = (
    f"{FLAG_MARK} Flagged: the figure is reported but something about its measurement "
    "needs a look; the flag is named in the cell and explained under Flags."
)
ERROR_FAILED_LEGEND = (
    "Error: too many requests failed in this cell, so its figures are not reported; "
    "the failures are counted by kind under Errors."
)
ERROR_UNMEASURED_LEGEND = (
    "Error: the cell could not be measured (its reason is under Flags), so it has no figures."
)
NOT_RUN_LEGEND = (
    "Not run: the server stopped answering before this cell; "
    "`speedmatrix run --resume DIR` measures it."
)
NOT_MEASURED_LEGEND = "Not measured: the run ended before this cell was reached."


def legend(statuses) -> str:
    """The seed's legend sentences for the statuses present only (queued, over capacity), in
    the seed's order; empty when neither is present."""
    present = set(statuses)
    parts = [
        text
        for status, text in (("queued", QUEUED_LEGEND), ("over_capacity", OVER_CAPACITY_LEGEND))
        if status in present
    ]
    return " ".join(parts)


TTFT_NOTE = (
    "TTFT is measured after the benchmark warms the server's prompt cache, "
    "so it mostly excludes prefill."
)
MATRIX_CAPTION = "total tok/s · rows are context length, columns are simultaneous requests"
PREFILL_CAPTION = "prompt tok/s by context length"
ALL_CAPTION = "Latencies are medians. Total tok/s is output across all simultaneous requests."

ALL_COLUMNS = [
    "Phase",
    "Context",
    "Requests at once",
    "Status",
    "Total tok/s",
    "Per request tok/s",
    "TTFT",
    "Time between tokens",
    "Average active requests",
    "Completed requests",
    "Output tokens",
    "Measured for",
]

_CODES = {
    "discrete_gpu": "Discrete GPU",
    "integrated_gpu": "Integrated GPU",
    "cpu": "CPU",
    "fixed_duration": "Fixed duration",
    "fixed_requests": "Fixed request count",
    "decode_warmup": "Measured during decode warm-up",
    "during_decode_warmup": "Measured during decode warm-up",
    "measured_during_decode_warmup": "Measured during decode warm-up",
    "separate": "Separate prefill cells",
    "skip": "Not measured",
}


def _dash_if_missing(fn: Callable[[Any], str]) -> Callable[[Any], str]:
    """The formatter, with "—" for a missing value (None, NaN, "")."""

    @functools.wraps(fn)
    def wrapper(v: Any) -> str:
        return DASH if missing(v) else fn(v)

    return wrapper


def _thousands_k(v: Any, decimals: int) -> str:
    """``10.4K`` from 10,000 up, else the value with ``decimals`` and thousands separators."""
    v = float(v)
    if abs(v) >= 10_000:
        return f"{v / 1000:,.1f}K"
    return f"{v:,.{decimals}f}"


@_dash_if_missing
def tok_s(v: Any) -> str:
    """Throughput as in the tables: ``10.4K`` from 10,000 up, else ``1,583.9``."""
    return _thousands_k(v, 1)


@_dash_if_missing
def tok_s_short(v: Any) -> str:
    """Throughput as in the prefill list: ``10.4K`` from 10,000 up, else ``9,995``."""
    return _thousands_k(v, 0)


def _fixed(spec: str, unit: str, doc: str) -> Callable[[Any], str]:
    """The formatter of a number in format ``spec`` followed by ``unit`` ("—" when missing)."""

    def fmt(v: Any) -> str:
        return f"{float(v):{spec}}{unit}"

    fmt.__doc__ = doc
    return _dash_if_missing(fmt)


ms = _fixed(",.0f", " ms", "Whole milliseconds: ``790 ms``, ``1,590 ms`` (TTFT).")
ms1 = _fixed(",.1f", " ms", "Milliseconds with one decimal: ``16.8 ms`` (time between tokens).")
one = _fixed(",.1f", "", "One decimal with thousands separators: ``98.1``.")
seconds = _fixed(",.1f", " s", "A measured duration: ``30.0 s``.")
ratio = _fixed(".2f", "×", "A ratio: ``1.07×``.")


@_dash_if_missing
def count(v: Any) -> str:
    """An integer count: ``1,779``."""
    return f"{round(float(v)):,d}"


@_dash_if_missing
def plain_seconds(v: Any) -> str:
    """A configured duration: ``30 s`` (``2.5 s`` when fractional)."""
    v = float(v)
    return f"{v:,.0f} s" if v == int(v) else f"{v:,g} s"


@_dash_if_missing
def tokens(v: Any) -> str:
    """A token budget: ``4,096 tokens``."""
    return f"{count(v)} tokens"


@_dash_if_missing
def gigabytes(v: Any) -> str:
    """``141 GB`` (one decimal when fractional)."""
    v = float(v)
    return f"{v:,.0f} GB" if abs(v - round(v)) < 0.05 else f"{v:,.1f} GB"


@_dash_if_missing
def percent(v: Any) -> str:
    """A fraction shown as a signed percentage: ``+3.2%``."""
    return f"{float(v) * 100:+.1f}%"


@_dash_if_missing
def context_label(c: Any) -> str:
    """Context length in K (1024 tokens): ``8K``, ``123K``; small values as they are."""
    return format_tokens(int(c))


def status_text(status: Any) -> str:
    if missing(status):
        return "Not measured"
    return STATUS_TEXT.get(str(status), str(status).replace("_", " ").capitalize())


def phase_text(phase: Any) -> str:
    return PHASE_TEXT.get(str(phase), str(phase).capitalize())


@_dash_if_missing
def code_text(v: Any) -> str:
    """Human text for the enum-like metadata values (``fixed_duration`` → ``Fixed duration``)."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    return _CODES.get(str(v), str(v))


def ci(lo: Any, hi: Any, fmt=one) -> str:
    """A 95% interval ``59.1–59.5``; a dash when either end is unknown.

    Every figure here is non-negative, so a lower end below zero (too few bins
    for a tight interval) is shown as 0.
    """
    if missing(lo) or missing(hi):
        return DASH
    a, b = fmt(max(float(lo), 0.0)), fmt(hi)
    unit = ""
    for suffix in (" ms", " s"):
        if a.endswith(suffix) and b.endswith(suffix):
            a, unit = a[: -len(suffix)], suffix
            b = b[: -len(suffix)]
    return f"{a}–{b}{unit}"


def range_text(values: list[int], fmt=str) -> str:
    """``(8K–123K)`` style span of sorted values; one value gives ``(8K)``."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    return f"({fmt(lo)})" if lo == hi else f"({fmt(lo)}–{fmt(hi)})"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"
