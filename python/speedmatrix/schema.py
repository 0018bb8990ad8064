"""The published JSON Schema of ``run.json`` (``speedmatrix.run/1``), shipped in the package.

``schema()`` is the schema as a dict (``speedmatrix/schemas/run-1.schema.json``; other tools
can validate against the same file); ``check(doc, source)`` validates a loaded run.json and
raises :class:`RunSchemaError` with one line naming the first problem and where it is.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from speedmatrix.errors import SpeedmatrixError

SCHEMA_ID = "speedmatrix.run/1"
SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "run-1.schema.json"


class RunSchemaError(SpeedmatrixError):
    """run.json does not follow ``speedmatrix.run/1``; the message is one line."""


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def _where(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "the top level"


def check(doc: Any, source: str = "run.json") -> dict:
    """``doc`` when it follows the schema; else RunSchemaError: ``SOURCE does not follow
    speedmatrix.run/1: at cells[3].status: 'done' is not one of [...]``."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = jsonschema.exceptions.best_match(errors)
        msg = " ".join(str(e.message).split())
        if len(msg) > 200:
            msg = msg[:199] + "…"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RunSchemaError(
            f"{source} does not follow {SCHEMA_ID}: at {_where(e.absolute_path)}: {msg}{more}"
        )
    return doc
