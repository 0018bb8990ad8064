"""`speedmatrix demo`: the built-in engine, the seed's matrix, a report."""

from __future__ import annotations

import argparse

from speedmatrix import demo


def command(args: argparse.Namespace) -> int:

    return demo.main(out=args.out, duration=args.duration, progress=not args.quiet)
