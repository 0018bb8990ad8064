"""A matrix file as text: the TOML table a Matrix is read from (and the keys that would be
silently dropped outside it), the short names of its keys, and how a matrix differs from a
preset in words; the forms people type for a list ("8k,16k", "1,2,4") before validation.
speedmatrix.matrix builds the Matrix from what this returns."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedmatrix.units import parse_token_list

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "changes_text",
    "coerce_contexts",
    "coerce_float_list",
    "coerce_int_list",
    "read_table",
    "resolve_aliases",
]


_ALIASES = (
    ("duration", "duration_s"),
    ("idle_timeout", "idle_timeout_s"),
    ("request_idle_timeout", "request_idle_timeout_s"),
    ("min_duration", "min_duration_s"),
    ("extra_body", "extra"),
)


def resolve_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """``duration`` -> ``duration_s`` and the other short names; both given is an error."""
    data = dict(data)
    for short, full in _ALIASES:
        if short in data:
            if full in data:
                raise ValueError(f"{short}: given together with {full}")
            data[full] = data.pop(short)
    return data


def read_table(source: str | Path, known: set[str]) -> dict[str, Any]:
    """The matrix table of a TOML file path or TOML text; ``known``: the Matrix's field
    names, which a key outside ``[matrix]`` is named against."""
    if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and "=" not in source
    ):
        text = Path(source).read_text(encoding="utf-8")
    else:
        text = source
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"matrix TOML does not parse: {exc}") from None
    if "matrix" not in data:
        return data
    if not isinstance(data["matrix"], dict):
        raise ValueError("matrix: must be a table ([matrix])")  # noqa: TRY004 - a user's file
    _misplaced(data, known)
    return dict(data["matrix"])


def _misplaced(doc: dict[str, Any], known: set[str]) -> None:
    """A file with a ``[matrix]`` table holds nothing else: a key outside it would be read
    by nobody. The usual cause is a key written after another table's header (``[slo]``):
    TOML puts it in that table, so the message names the key and the table it landed in."""
    for key, value in doc.items():
        if key == "matrix":
            continue
        if not isinstance(value, dict):
            raise ValueError(  # noqa: TRY004 - a user's file: the CLI's one-line ValueError
                f"{key}: outside [matrix], where it would be ignored; put it under [matrix]"
            )
        strays = [k for k in value if k in known]
        if strays:
            raise ValueError(
                f"{strays[0]}: sits in the [{key}] table, not in [matrix], where it would be "
                f"ignored (a key after a [table] header belongs to that table; write "
                f"{key} = {{ ... }} inline, or move the key above the header)"
            )
        raise ValueError(
            f"[{key}]: a table outside [matrix], where it would be ignored"
            + (f"; write it as [matrix.{key}]" if key in known else "")
        )


def changes_text(name: str, changes: dict[str, dict[str, Any]]) -> str:
    """The changes of :func:`preset_changes` in words, one clause each; the shared prefix
    says what it does to the prompts (the difference a reader must not miss)."""
    parts = []
    for key, change in changes.items():
        was, now = change["preset"], change["run"]
        if key == "shared_prefix" and isinstance(now, int):
            what = (
                f"the prompts of a cell share all but their last {-now} tokens"
                if now < 0
                else f"the prompts of a cell share their first {now} tokens"
                if now > 0
                else "every prompt is unique"
            )
            parts.append(f"{what} (the {name} preset's: {_shared_text(was)})")
        else:
            parts.append(f"{key} {_value_text(now)} (the {name} preset's: {_value_text(was)})")
    return "; ".join(parts)


def _shared_text(value: Any) -> str:
    if value == 0:
        return "every prompt unique"
    return f"all but the last {-value} shared" if value < 0 else f"the first {value} shared"


def _value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---- the forms people type: kept as given where they do not parse, so that
# Matrix.problems() reports them with the field name
def coerce_contexts(value: Any, keywords: tuple[str, ...]) -> list[int | str]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    return parse_token_list(value, keywords=keywords, keep_bad=True)


def _split_list(text: str, convert: Any) -> list[Any]:
    """The items of "a,b,c", each converted; an item that does not convert is kept as it
    is, so that validate() reports it with the field's name."""
    out: list[Any] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(convert(item))
        except ValueError:
            out.append(item)
    return out


def coerce_float_list(value: Any) -> list[Any]:
    """A list field as typed (``"0.5,1"``, ``2``) or as given (a sequence; None: empty)."""
    if isinstance(value, str):
        return _split_list(value, float)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    return list(value or [])


def coerce_int_list(value: str | int) -> list[Any]:
    return [value] if isinstance(value, int) else _split_list(value, int)


def parse_typed(obj: Any, parsers: dict[str, Callable[[str], Any]]) -> None:
    """The forms people type (``"2s"``, ``"8k"``, ``"2%"``) into the fields' types, in place:
    each field of ``obj`` named in ``parsers`` that holds a string is parsed by its parser."""
    for name, parse in parsers.items():
        value = getattr(obj, name)
        if isinstance(value, str):
            setattr(obj, name, parse(value))
