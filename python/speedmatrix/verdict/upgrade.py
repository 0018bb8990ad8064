"""Runs saved in older forms, read as today's: what the verdict needs that they lack.

A run saved before ``meta["verdict"]`` existed has no rules and no engine facts: its
rules are the defaults (with its matrix's error threshold), its facts what its cells and
records show (``output_not_forced`` flags, the metric names in the records), and each
function says so in a note. (Records saved without their clock stamps take them from the
stored cell: `speedmatrix.records.Records.from_loaded`.)
"""

from __future__ import annotations

import os
import zipfile

from speedmatrix import runfile
from speedmatrix.verdict.names import Flag
from speedmatrix.verdict.rules import EngineFacts, Rules

__all__ = ["facts_of", "rules_of"]


def rules_of(doc: dict) -> tuple[Rules, str | None]:
    """The rules a saved run was judged by, and a note when they had to be assumed."""
    meta = doc.get("meta") or {}
    saved = (meta.get("verdict") or {}).get("rules")
    if saved:
        return Rules.from_dict(saved), None
    threshold = ((meta.get("run") or {}).get("matrix") or {}).get("error_threshold")
    rules = Rules() if threshold is None else Rules(error_threshold=float(threshold))
    return rules, "no rules saved in this run (saved before meta.verdict): default thresholds"


def facts_of(doc: dict, run_dir: str | os.PathLike | None) -> tuple[EngineFacts, str | None]:
    """The engine facts a saved run was judged with, and a note when they were inferred."""
    meta = doc.get("meta") or {}
    saved = (meta.get("verdict") or {}).get("facts")
    if saved:
        return EngineFacts.from_dict(saved), None
    cells = doc.get("cells") or []
    forced = not any(Flag.OUTPUT_NOT_FORCED in (c.get("flags") or []) for c in cells)
    names: list[str] = []
    for c in cells:
        if c.get("records") and run_dir is not None:
            try:
                names = runfile.load_records(run_dir, c["records"])["metrics"]["names"]
            except (OSError, ValueError, zipfile.BadZipFile):
                continue
            if names:
                break
    roles: dict[str, str | None] = {"running": None, "waiting": None, "kv_usage": None}
    for n in names:
        low = n.lower()
        if "running" in low and roles["running"] is None:
            roles["running"] = n
        elif ("waiting" in low or "queue" in low) and roles["waiting"] is None:
            roles["waiting"] = n
        elif ("usage" in low or "kv" in low) and roles["kv_usage"] is None:
            roles["kv_usage"] = n
    facts = EngineFacts(
        output_forced=forced,
        metric_running=roles["running"],
        metric_waiting=roles["waiting"],
        metric_kv_usage=roles["kv_usage"],
    )
    return facts, (
        "no engine facts saved in this run (saved before meta.verdict): output forced "
        "unless a cell says otherwise, metric names from the records"
    )
