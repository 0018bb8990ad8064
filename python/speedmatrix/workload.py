"""Workloads from a file (``--prompts FILE``): the prompts a user already benchmarks with.

Accepted shapes (chosen by content, not by file name):

- JSONL, one request per line: ``{"prompt": "...", "max_tokens": 128}`` (completions) or
  ``{"messages": [{"role": "user", "content": "..."}], "max_tokens": 128}`` (chat);
  ``max_tokens`` (or ``max_completion_tokens``, ``output_len``) is optional;
- ShareGPT JSON: a list of ``{"conversations": [{"from": "human", "value": "..."},
  {"from": "gpt", "value": "..."}, ...]}``; each conversation's first human turn is the
  prompt (its first ``gpt`` reply is kept as ``reference`` for lengths counted later).

Blank lines and ``//`` comment lines of a JSONL file are skipped. Every request keeps its
own ``max_tokens`` (None = the matrix's output length) and its index in the file, so a
cell's records (``body`` = index into the cell's bodies) map back to the file's requests.
Bad input raises :class:`WorkloadError` (one line, naming the file and line).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedmatrix.errors import SpeedmatrixError

__all__ = ["FilePrompt", "WorkloadError", "load_prompts"]


class WorkloadError(SpeedmatrixError):
    """A prompts file that cannot be read as a workload."""


@dataclass(frozen=True)
class FilePrompt:
    index: int  # position in the file (0-based, over the requests kept)
    payload: str | list[dict[str, str]]  # a completion prompt, or chat messages
    max_tokens: int | None  # the request's own output length; None = the matrix's
    reference: str | None = None  # ShareGPT: the recorded answer, for length counting

    @property
    def is_chat(self) -> bool:
        return isinstance(self.payload, list)


def _max_tokens(obj: dict, where: str) -> int | None:
    for key in ("max_tokens", "max_completion_tokens", "output_len"):
        if key in obj and obj[key] is not None:
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise WorkloadError(f"{where}: {key} must be a positive integer, not {v!r}")
            return v
    return None


def _messages(v: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(v, list) or not v:
        raise WorkloadError(f"{where}: messages must be a non-empty list")
    for m in v:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise WorkloadError(f"{where}: each message needs a role and a content")
    return v


def _from_object(obj: Any, index: int, where: str) -> FilePrompt:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        return FilePrompt(index, _messages(obj["messages"], where), _max_tokens(obj, where))
    if "prompt" in obj:
        p = obj["prompt"]
        if not isinstance(p, str) or not p:
            raise WorkloadError(f"{where}: prompt must be a non-empty string")
        return FilePrompt(index, p, _max_tokens(obj, where))
    raise WorkloadError(f"{where}: needs a 'prompt' or 'messages' field")


def _from_sharegpt(items: list, path: str) -> list[FilePrompt]:
    out: list[FilePrompt] = []
    for i, item in enumerate(items):
        where = f"{path}: conversation {i}"
        if not isinstance(item, dict):
            raise WorkloadError(f"{where}: expected an object with 'conversations'")
        if "conversations" not in item:
            out.append(_from_object(item, len(out), where))  # a JSON list of JSONL-style objects
            continue
        turns = item["conversations"]
        if not isinstance(turns, list):
            raise WorkloadError(f"{where}: 'conversations' must be a list")
        human = next(
            (t for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user")), None
        )
        if human is None or not isinstance(human.get("value"), str) or not human["value"]:
            continue  # a conversation with no human turn has nothing to send (vLLM skips it)
        gpt = next(
            (t for t in turns if isinstance(t, dict) and t.get("from") in ("gpt", "assistant")),
            None,
        )
        ref = gpt.get("value") if gpt and isinstance(gpt.get("value"), str) else None
        out.append(FilePrompt(len(out), human["value"], _max_tokens(item, where), ref))
    return out


def load_prompts(path: str | os.PathLike[str], limit: int | None = None) -> list[FilePrompt]:
    """The requests of a prompts file, in file order (the first ``limit`` when given)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"--prompts: no such file {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"--prompts: cannot read {path}: {exc}") from None
    stripped = text.lstrip()
    prompts: list[FilePrompt]
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
        prompts = _from_sharegpt(items, str(path))
    else:
        prompts = []
        for lineno, line in enumerate(text.splitlines(), 1):
            s = line.strip()
            if not s or s.startswith("//"):
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: not valid JSON: {exc.msg}") from None
            prompts.append(_from_object(obj, len(prompts), where))
            if limit is not None and len(prompts) >= limit:
                break
    if limit is not None:
        prompts = prompts[:limit]
    if not prompts:
        raise WorkloadError(f"--prompts: {path} holds no requests")
    return prompts
