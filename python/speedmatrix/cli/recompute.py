"""`speedmatrix recompute`: a saved run judged again from its records."""

from __future__ import annotations

import argparse

from speedmatrix.cliargs import UsageError
from speedmatrix.recompute import recompute_doc
from speedmatrix.runfile import read_run, write_run


def command(args: argparse.Namespace) -> int:

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
