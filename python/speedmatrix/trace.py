"""Request traces for replay (``--trace FILE``): when each request arrives and how long it is.

Accepted shapes (chosen by content, not by file name):

- our own JSONL, one request per line: ``{"arrival_ms": 0, "input_tokens": 512,
  "output_tokens": 128}`` with optional ``"session"`` (a conversation id: a later request of
  it starts with the session's previous prompt, `trafficrun`) and
  ``"prefix_hash"`` (requests with the same hash share a prompt prefix of
  ``"prefix_tokens"``, default `BLOCK_TOKENS`);
- Mooncake JSONL (kvcache-ai/Mooncake's FAST'25 traces): ``{"timestamp": 27482,
  "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}``, ``timestamp`` in ms
  since the first request, ``hash_ids`` the prompt's block hashes (shared ids = shared prefix);
- the Azure LLM inference trace CSV (Azure/AzurePublicDataset): a header
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` and wall-clock times such as
  ``2023-11-16 18:15:46.6805900``.

A bad row is skipped with one line naming the file and line (at most ``MAX_ERROR_LINES``
kept, then a count); a file with no good row raises :class:`TraceError`. Arrivals are
offsets from the earliest request, so a trace may start at any time.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from speedmatrix.errors import SpeedmatrixError

__all__ = [
    "BLOCK_TOKENS",
    "MAX_ERROR_LINES",
    "Trace",
    "TraceError",
    "TraceRequest",
    "load_trace",
    "parse_trace",
    "schedule_ns",
    "shared_blocks",
]

#: bad-row lines kept per trace; the rest are only counted
MAX_ERROR_LINES = 20
#: tokens of one prompt block (Mooncake's hash_ids each cover 512 tokens)
BLOCK_TOKENS = 512
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(SpeedmatrixError):
    """A trace file with no request that can be replayed."""


@dataclass(frozen=True)
class TraceRequest:
    line: int  # 1-based line of the file the request came from
    arrival_ns: int  # offset from the trace's first arrival, before any speed-up
    input_tokens: int
    output_tokens: int
    session: str | None = None
    prefix_hash: str | None = None  # equal hashes = a shared prompt prefix
    #: the prompt's blocks of `BLOCK_TOKENS` tokens (Mooncake ``hash_ids``; our JSONL: its
    #: prefix_hash for the first ``prefix_tokens``): equal leading ids = a shared prefix
    blocks: tuple[str, ...] = ()
    prefix_tokens: int = 0  # our JSONL: tokens the prefix_hash covers (default BLOCK_TOKENS)


@dataclass(frozen=True)
class Trace:
    format: str  # "jsonl", "mooncake" or "azure"
    requests: tuple[TraceRequest, ...]  # in arrival order (the file's order among ties)
    errors: tuple[str, ...]  # one line per bad row, at most MAX_ERROR_LINES
    bad_rows: int  # every bad row, counted


class _RowError(ValueError):
    pass


def _count(row: dict[str, Any], key: str, *, positive: bool) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise _RowError(f"{key} must be a whole number, got {value!r}")
    if int(value) < (1 if positive else 0):
        raise _RowError(f"{key} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return int(value)


def _time_ms(row: dict[str, Any], key: str) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise _RowError(f"{key} must be a time in ms >= 0, got {value!r}")
    return round(float(value) * 1_000_000)


def _own_row(row: dict[str, Any], line: int) -> TraceRequest:
    session, prefix = row.get("session"), row.get("prefix_hash")
    return TraceRequest(
        line=line,
        arrival_ns=_time_ms(row, "arrival_ms"),
        input_tokens=_count(row, "input_tokens", positive=True),
        output_tokens=_count(row, "output_tokens", positive=True),
        session=None if session is None else str(session),
        prefix_hash=None if prefix is None else str(prefix),
        blocks=() if prefix is None else (str(prefix),),
        prefix_tokens=0
        if prefix is None
        else _count(row, "prefix_tokens", positive=True)
        if "prefix_tokens" in row
        else BLOCK_TOKENS,
    )


def _mooncake_row(row: dict[str, Any], line: int) -> TraceRequest:
    hash_ids = row.get("hash_ids", [])
    if not isinstance(hash_ids, list):
        raise _RowError(f"hash_ids must be a list, got {hash_ids!r}")
    return TraceRequest(
        line=line,
        arrival_ns=_time_ms(row, "timestamp"),
        input_tokens=_count(row, "input_length", positive=True),
        output_tokens=_count(row, "output_length", positive=True),
        session=None if row.get("session_id") is None else str(row["session_id"]),
        prefix_hash=str(hash_ids[0]) if hash_ids else None,
        blocks=tuple(str(h) for h in hash_ids),
    )


def _azure_time_ns(text: str) -> int:
    """Wall-clock ns of an Azure TIMESTAMP (its fraction has 7 digits: Python reads 6)."""
    whole, _, frac = text.strip().partition(".")
    try:
        base = datetime.fromisoformat(whole)
    except ValueError:
        raise _RowError(f"TIMESTAMP {text!r} is not a date and time") from None
    if frac and not frac.isdigit():
        raise _RowError(f"TIMESTAMP {text!r} is not a date and time")
    frac_ns = int((frac + "000000000")[:9]) if frac else 0
    return int(base.timestamp()) * 1_000_000_000 + frac_ns


def _azure_count(value: str | None, key: str) -> int:
    try:
        return _count({key: int((value or "").strip())}, key, positive=True)
    except ValueError as exc:
        raise _RowError(str(exc) if isinstance(exc, _RowError) else f"{key} {value!r}") from None


def _parse_azure(text: str, name: str) -> tuple[list[TraceRequest], list[str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _AZURE_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{name}: CSV header lacks {', '.join(missing)} (Azure LLM trace)")
    requests, errors = [], []
    for row in reader:
        line = reader.line_num
        try:
            requests.append(
                TraceRequest(
                    line=line,
                    arrival_ns=_azure_time_ns(row["TIMESTAMP"] or ""),
                    input_tokens=_azure_count(row["ContextTokens"], "ContextTokens"),
                    output_tokens=_azure_count(row["GeneratedTokens"], "GeneratedTokens"),
                )
            )
        except _RowError as exc:
            errors.append(f"{name}:{line}: {exc}")
    return requests, errors


def _parse_jsonl(text: str, name: str) -> tuple[str, list[TraceRequest], list[str]]:
    fmt, requests, errors = "", [], []
    for line, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("//"):
            continue
        try:
            row = json.loads(stripped)
            if not isinstance(row, dict):
                raise _RowError("a row must be a JSON object")
            row_fmt = "mooncake" if "timestamp" in row else "jsonl"
            fmt = fmt or row_fmt
            if row_fmt != fmt:
                raise _RowError(f"a {row_fmt} row in a {fmt} trace")
            parse = _mooncake_row if fmt == "mooncake" else _own_row
            requests.append(parse(row, line))
        except (ValueError, _RowError) as exc:
            errors.append(f"{name}:{line}: {exc}")
    return fmt or "jsonl", requests, errors


def parse_trace(text: str, name: str = "trace") -> Trace:
    """The requests of a trace's text (``name`` labels its error lines), in arrival order."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not first:
        raise TraceError(f"{name}: the trace is empty")
    if first.startswith(("{", "//")):
        fmt, requests, errors = _parse_jsonl(text, name)
    else:
        fmt = "azure"
        requests, errors = _parse_azure(text, name)
    if not requests:
        why = errors[0] if errors else f"{name}: no request rows"
        raise TraceError(f"no request can be replayed ({why})")
    start_ns = min(r.arrival_ns for r in requests)
    ordered = sorted(requests, key=lambda r: (r.arrival_ns, r.line))
    shifted = tuple(dataclasses.replace(r, arrival_ns=r.arrival_ns - start_ns) for r in ordered)
    return Trace(fmt, shifted, tuple(errors[:MAX_ERROR_LINES]), len(errors))


def load_trace(path: str | Path) -> Trace:
    """The trace in ``path``; :class:`TraceError` (one line) when it cannot be read at all."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{p}: cannot read the trace ({exc.__class__.__name__})") from None
    return parse_trace(text, str(p))


def schedule_ns(trace: Trace, speedup: float = 1.0) -> list[int]:
    """Each request's intended send time (ns from the start): the trace's arrivals / ``speedup``."""
    if not speedup > 0:
        raise TraceError(f"--speedup must be > 0, got {speedup!r}")
    return [round(r.arrival_ns / speedup) for r in trace.requests]


def shared_blocks(request: TraceRequest) -> list[tuple[str, int]]:
    """The blocks a request's prompt starts with and their tokens, in order. Mooncake: each
    hash id covers `BLOCK_TOKENS`, the last cut at the prompt's end (equal lists, equal
    prompts, as in the trace). Our JSONL: its prefix_hash covers ``prefix_tokens``, at most
    all but the prompt's last token. Requests whose lists start alike share those blocks'
    tokens; the prompt past them is the request's own."""
    if request.prefix_tokens and request.blocks:
        return [(request.blocks[0], min(request.prefix_tokens, request.input_tokens - 1))]
    out: list[tuple[str, int]] = []
    left = request.input_tokens
    for block in request.blocks:
        if left <= 0:
            break
        out.append((block, min(BLOCK_TOKENS, left)))
        left -= out[-1][1]
    return out
