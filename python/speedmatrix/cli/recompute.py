"""`speedmatrix recompute`: a saved run judged again from its records."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter
from speedmatrix.cliargs import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `recompute` command."""
    rec = sub.add_parser(
        "recompute",
        help="rebuild every cell of a saved run from its records (optionally with other rules)",
        description="Judges every measured cell of a saved run again from its raw records, "
        "the engine facts and the rules saved with it, and says which cells changed. "
        "Nothing is written without --write.",
        epilog="examples:\n  speedmatrix recompute out/h200\n"
        "  speedmatrix recompute out/h200 --rule error_threshold=0.1 --write\n",
        formatter_class=Formatter,
    )
    rec.add_argument("dir", type=Path, help="folder of a saved run (holds run.json and records/)")
    rec.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change a threshold (e.g. error_threshold=0.1, queue_gap_requests=1); repeatable",
    )
    rec.add_argument(
        "--write", action="store_true", help="rewrite DIR/run.json with the recomputed cells"
    )


def command(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix.recompute import recompute_doc
    from speedmatrix.runfile import read_run, write_run

    changes: dict[str, float] = {}
    for item in args.rule:
        name, eq, value = item.partition("=")
        try:
            changes[name.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--rule {item!r}: expected NAME=NUMBER") from None
        if not eq:
            raise UsageError(f"--rule {item!r}: expected NAME=NUMBER")
    doc = read_run(args.dir)
    try:
        out = recompute_doc(doc, args.dir, changes=changes or None)
    except KeyError as exc:
        raise UsageError(f"--rule: {exc.args[0]}") from None
    for note in out.notes:
        print(f"note: {note}")
    old = {c.get("id"): c for c in doc.get("cells") or []}
    for cid in out.changed:
        new = next(c for c in out.doc["cells"] if c.get("id") == cid)
        was = old.get(cid) or {}
        what = []
        if was.get("status") != new.get("status"):
            what.append(f"status {was.get('status')} -> {new.get('status')}")
        gained = sorted(set(new.get("flags") or []) - set(was.get("flags") or []))
        lost = sorted(set(was.get("flags") or []) - set(new.get("flags") or []))
        what += [f"+{f}" for f in gained] + [f"-{f}" for f in lost]
        print(f"{cid}: {', '.join(what) or 'figures changed'}")
    cells = len(out.doc.get("cells") or [])
    print(f"{len(out.changed)} of {cells} cells changed")
    if args.write:
        path = write_run(args.dir, out.doc)
        print(f"wrote {path}")
    return 0
