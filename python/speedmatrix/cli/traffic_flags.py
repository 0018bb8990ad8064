"""The `run` flags of issue 23's traffic shapes (`speedmatrix.trafficaxes`): the prefix-cache
axis, the prefill-interference cell and trace replay. Each sets a matrix field; a bad value
is one line naming the flag."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from speedmatrix.cli.common import value_flags
from speedmatrix.cliargs import UsageError
from speedmatrix.prefixcache import parse_cached_fractions
from speedmatrix.trace import TraceError, load_trace
from speedmatrix.units import parse_duration, parse_tokens

__all__ = ["TRAFFIC_FLAGS", "add_traffic_flags", "apply_traffic_flags"]

#: (argparse attribute, matrix field, the flag as typed)
TRAFFIC_FLAGS = (
    ("cached_fraction", "cached_fraction", "--cached-fraction"),
    ("interference", "interference_every_s", "--interference"),
    ("trace", "trace", "--trace"),
    ("speedup", "speedup", "--speedup"),
    ("sessions", "sessions", "--sessions"),
    ("turn_tokens", "turn_tokens", "--turn-tokens"),
    ("think_time", "think_time_s", "--think-time"),
)


def add_traffic_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "traffic shapes",
        "each replaces the closed-loop decode cells (docs/metrics.md); one at a time",
    )
    value_flags(
        g,
        (
            "--cached-fraction",
            "SHARES",
            (
                "shares of each prompt served from a prefix the server has seen, e.g. 0,0.5,0.9: "
                "the decode cells become contexts x concurrency x share; the report shows the "
                "share asked against the one the server delivered"
            ),
        ),
        (
            "--interference",
            "EVERY",
            (
                "N streams (--concurrency) decode while one cold prompt of each --contexts arrives"
                " every EVERY (e.g. 2s); reports the decoders' p99 time between tokens during "
                "prefills against clear of them"
            ),
        ),
        (
            "--trace",
            "FILE",
            (
                "replay a trace: JSONL {arrival_ms, input_tokens, output_tokens}, Mooncake JSONL "
                "or the Azure LLM CSV; each request its own prompt and output length"
            ),
        ),
        (
            "--speedup",
            "K",
            "replay the trace K times faster (arrivals / K)",
        ),
        (
            "--sessions",
            "TURNS",
            (
                "conversations of TURNS turns, --concurrency of them at once, the first prompt of "
                "each --contexts: each turn adds the answer (--max-output) and --turn-tokens new "
                "tokens"
            ),
        ),
        (
            "--turn-tokens",
            "N",
            "new user tokens a turn adds (default 256)",
        ),
        (
            "--think-time",
            "DURATION",
            "pause between turns (default 0)",
        ),
    )


def apply_traffic_flags(m: Any, args: argparse.Namespace) -> None:
    """The traffic flags onto matrix ``m``; UsageError (one line) on a bad value."""
    try:
        if getattr(args, "cached_fraction", None):
            m.cached_fraction = parse_cached_fractions(args.cached_fraction)
        if getattr(args, "interference", None):
            m.interference_every_s = parse_duration(args.interference)
    except ValueError as exc:
        raise UsageError(
            f"--{'cached-fraction' if args.cached_fraction else 'interference'}: {exc}"
        ) from None
    if getattr(args, "trace", None):
        try:
            load_trace(args.trace)  # a bad file is one line now, before any work
        except TraceError as exc:
            raise UsageError(f"--trace: {exc}") from None
        m.trace = str(Path(args.trace).resolve())
    for attr, flag, parse in (
        ("sessions", "--sessions", int),
        ("turn_tokens", "--turn-tokens", parse_tokens),
        ("think_time", "--think-time", parse_duration),
    ):
        if getattr(args, attr, None):
            try:
                value = parse(getattr(args, attr))
            except ValueError:
                raise UsageError(f"{flag}: {getattr(args, attr)!r} is not valid") from None
            setattr(m, {a: f for a, f, _ in TRAFFIC_FLAGS}[attr], value)
    if getattr(args, "speedup", None):
        try:
            m.speedup = float(args.speedup)
        except ValueError:
            raise UsageError(f"--speedup: {args.speedup!r} is not a number") from None
