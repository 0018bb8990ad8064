"""run.json's ``meta``: what was measured, on what, with what, and the facts and rules a
saved run's verdicts are recomputed from (``meta["verdict"]``)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import urllib.parse
from typing import Any

from speedmatrix import __version__
from speedmatrix.verdict import EngineFacts, Rules

__all__ = ["plan_meta", "run_meta", "tokenizer_name", "utc_now", "verdict_meta"]


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def verdict_meta(facts: EngineFacts, rules: Rules) -> dict[str, Any]:
    """meta["verdict"]: the engine facts and the rules the cells were judged by."""
    return {"facts": facts.to_dict(), "rules": rules.to_dict()}


def run_meta(url: str, target: Any, matrix: Any, info: dict, rules: Rules) -> dict:
    """The whole ``meta`` of a new run against `target` (a discovered Target)."""
    from speedmatrix.adapters import strip_credentials
    from speedmatrix.hardware import detect_hardware
    from speedmatrix.redact import redact

    t = target
    host = urllib.parse.urlsplit(url).hostname or ""
    local = host in ("127.0.0.1", "localhost", "::1") or host == socket.gethostname()
    hardware = detect_hardware(local=local, given=info.get("hardware") or {}, simulated=t.simulated)
    engine = t.engine_meta()
    engine.update({k: v for k, v in (info.get("engine") or {}).items() if v})
    launch = info.get("launch_command")
    matrix_dict = matrix.to_dict() if hasattr(matrix, "to_dict") else {}
    return {
        "target": {**t.target_meta(matrix.api), "url": strip_credentials(t.url)},
        "engine": engine,
        "hardware": hardware,
        "run": {
            "served_model": t.model,
            "revision": info.get("revision"),
            "tool": "speedmatrix",
            "tool_version": __version__,
            "decode_test": "Fixed duration",
            "prefill_mode": "Measured during decode warm-up"
            if matrix.prefill_mode == "warmup"
            else "Separate cold requests",
            "duration_s": float(matrix.duration_s),
            "max_output": int(matrix.max_output),
            "started_at": utc_now(),
            "interrupted": False,
            "launch_command": redact(launch) if launch else None,
            "matrix": matrix_dict,
            "seed": int.from_bytes(os.urandom(4), "little"),
        },
        "capacity": t.capacity_meta(),
        "warnings": list(t.warnings),
        "client": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "verdict": verdict_meta(EngineFacts.of_target(t), rules),
    }


def plan_meta(planned: Any, matrix: Any) -> dict:
    """The plan as resolved against the server, for meta["run"]["plan"]: integer
    contexts ("max" resolved), concurrency levels, prefill contexts, what each keyword
    became, and the capacity figures the plan used."""
    keywords: dict[str, dict[str, int]] = {"contexts": {}, "prefill_contexts": {}}
    for c in planned:
        if isinstance(c.spec, str) and c.context:
            keywords["contexts" if c.phase == "decode" else "prefill_contexts"][c.spec] = int(
                c.context
            )
    return {
        "contexts": [int(c) for c in planned.contexts],
        "concurrency": [int(n) for n in matrix.concurrency],
        "prefill_contexts": [int(c) for c in planned.prefill_contexts],
        "keywords": keywords,
        "kv_tokens": planned.kv_tokens,
        "context_length": planned.context_length,
        "max_running": planned.max_running,
        "cells": len(planned),
    }


def tokenizer_name(tokenizer: Any) -> str:
    for attr in ("name_or_path", "name"):
        name = getattr(tokenizer, attr, None)
        if isinstance(name, str) and name:
            return name
    return type(tokenizer).__name__
