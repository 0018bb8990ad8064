"""`speedmatrix init`: a commented matrix file to start from."""

from __future__ import annotations

import argparse

from speedmatrix import dryrun
from speedmatrix.cliargs import UsageError


def command(args: argparse.Namespace) -> int:

    if args.path.exists() and not args.force:
        raise UsageError(f"{args.path} exists (--force overwrites it)")
    # a plain write: a config file the user edits, with the umask's usual mode
    args.path.write_text(dryrun.commented_toml(args.preset), encoding="utf-8")
    print(f"wrote {args.path}: edit it, then speedmatrix run --url URL --matrix {args.path}")
    return 0
