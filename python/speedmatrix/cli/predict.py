"""`speedmatrix predict`: a profile's decode matrix from the engine model, without load."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from speedmatrix.cliargs import UsageError
from speedmatrix.sim import SimError, load_profile
from speedmatrix.twin import predict_matrix
from speedmatrix.twin.model import ProfileError
from speedmatrix.units import format_tokens, parse_tokens


def _apply_set(profile: dict, items: list[str]) -> None:
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in profile:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE with a profile field as KEY")
        try:
            base = float(profile[key])
            new = base * float(value[:-1]) if value.endswith("x") else float(value)
        except (TypeError, ValueError):
            raise UsageError(f"--set {item!r}: VALUE must be a number or Nx") from None
        profile[key] = int(new) if isinstance(profile[key], int) else new


def _ints(text: str, what: str, parse=int) -> list[int]:
    try:
        return [parse(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r}: expected a comma-separated list") from None


def command(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.profile)
    except (SimError, OSError, ValueError) as exc:
        raise UsageError(f"profile {args.profile!r}: {exc}") from None
    _apply_set(profile, args.set)
    contexts = _ints(args.contexts, "--contexts", parse_tokens)
    levels = _ints(args.concurrency, "--concurrency")
    try:
        cells = predict_matrix(
            profile, contexts, levels, max_output=args.max_output, window_s=args.window
        )
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    for c in cells:
        if args.json:
            print(json.dumps(asdict(c)))
        elif c.total_tok_s is None:
            print(f"{format_tokens(c.context):>6} N={c.concurrency:<4} {c.status} (predicted)")
        else:
            print(
                f"{format_tokens(c.context):>6} N={c.concurrency:<4} {c.status:<8} "
                f"{c.total_tok_s:10.1f} tok/s  TBT {c.tbt_ms:7.2f} ms  (predicted)"
            )
    return 0
