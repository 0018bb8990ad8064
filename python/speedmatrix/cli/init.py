"""`speedmatrix init`: a commented matrix file to start from."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `init` command."""
    init = sub.add_parser(
        "init",
        help="write a commented matrix file to start from",
        description="Write a matrix definition (TOML) with every setting explained, to edit "
        "and pass to `speedmatrix run --matrix`.",
        epilog="examples:\n  speedmatrix init matrix.toml\n"
        "  speedmatrix init --preset quick small.toml\n",
        formatter_class=Formatter,
    )
    init.add_argument("path", type=Path, help="file to write (not overwritten without --force)")
    init.add_argument(
        "--preset", choices=["seed", "quick"], default="seed", help="the matrix to start from"
    )
    init.add_argument("--force", action="store_true", help="overwrite an existing file")


def command(args: argparse.Namespace) -> int:
    from speedmatrix import dryrun

    if args.path.exists() and not args.force:
        raise UsageError(f"{args.path} exists (--force overwrites it)")
    # a plain write: a config file the user edits, with the umask's usual mode
    args.path.write_text(dryrun.commented_toml(args.preset), encoding="utf-8")
    print(f"wrote {args.path}: edit it, then speedmatrix run --url URL --matrix {args.path}")
    return 0
