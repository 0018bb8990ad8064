"""The bodies of `speedmatrix fit` and `speedmatrix predict` (their parsers are in
speedmatrix.cli.fit / .predict, which load this module only when the command runs: it needs
numpy and pandas, which `speedmatrix --help` must not load)."""

from __future__ import annotations

import argparse
import json

from speedmatrix.cliargs import UsageError
from speedmatrix.results import load
from speedmatrix.runfile import RunFileError, atomic_write, write_run
from speedmatrix.sim import SimError, load_profile
from speedmatrix.twin.fitrun import fit_run
from speedmatrix.twin.model import STEP_KEYS, ProfileError
from speedmatrix.twin.predictrun import apply_overrides, predicted_doc
from speedmatrix.units import format_tokens, parse_tokens


def fit_command(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    try:
        base = load_profile(args.base) if args.base else None
        run = load(args.dir)
        profile = fit_run(run, base)
    except (SimError, ValueError, OSError, RunFileError) as exc:  # ProfileError is a ValueError
        raise UsageError(f"fit {args.dir}: {exc}") from None
    atomic_write(args.out, (json.dumps(profile, indent=1) + "\n").encode())
    sd = profile["fit"]["sd"]
    resid = profile["fit"]["residuals"]["tbt_ms"]
    print(f"fitted {len(profile['fit']['cells'])} decode cells of {args.dir} -> {args.out}")
    for key in STEP_KEYS:
        print(f"  {key:24s} {profile[key]:12.6g} ± {sd[key]:.3g}")
    worst = max(resid.values(), key=abs) if resid else 0.0
    print(f"  largest TBT residual {worst * 100:+.2f}% (model / measured - 1)")
    if "not_fitted" in profile["fit"]:
        print("  not fitted: " + "; ".join(profile["fit"]["not_fitted"]))
    return 0


def _ints(text: str, what: str, parse=int) -> list:
    try:
        return [parse(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r}: expected a comma-separated list") from None


def _context(text: str) -> int | str:
    return "max" if text.lower() == "max" else parse_tokens(text)


def _line(c: dict) -> str:
    head = f"{format_tokens(c['context']):>6} N={c['concurrency']:<4} {c['status']:<13}"
    if c["total_tok_s"] is None:
        return f"{head} (predicted)"
    return (
        f"{head} {c['total_tok_s']:10.1f} tok/s [{c['total_tok_s_low']:.1f}, "
        f"{c['total_tok_s_high']:.1f}]  TBT {c['tbt_ms']:7.2f} ms [{c['tbt_ms_low']:.2f}, "
        f"{c['tbt_ms_high']:.2f}]  (predicted)"
    )


def predict_command(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.profile)
        apply_overrides(profile, args.set)
    except (SimError, OSError, ValueError) as exc:
        raise UsageError(f"profile {args.profile!r}: {exc}") from None
    contexts = _ints(args.contexts, "--contexts", _context)
    levels = _ints(args.concurrency, "--concurrency")
    if not contexts or not levels or any(n < 1 for n in levels):
        raise UsageError("--contexts and --concurrency need at least one value each (N >= 1)")
    try:
        doc = predicted_doc(
            profile,
            contexts,
            levels,
            max_output=args.max_output,
            window_s=args.window,
            source=args.profile,
        )
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    for c in doc["cells"]:
        print(json.dumps(c) if args.json else _line(c))
    if args.out is not None:
        doc["meta"]["run"]["prediction"]["what_if"] = list(args.set)
        write_run(args.out, doc)
        print(f"predicted run written to {args.out} (every cell predicted: true)")
    return 0
