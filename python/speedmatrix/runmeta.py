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
from speedmatrix.adapters import strip_credentials
from speedmatrix.hardware import detect_hardware
from speedmatrix.naming import served_model_name
from speedmatrix.redact import redact
from speedmatrix.roofline import roofline_for_run
from speedmatrix.verdict import EngineFacts, Rules

__all__ = [
    "plan_meta",
    "run_meta",
    "server_changes",
    "tokenizer_name",
    "utc_now",
    "verdict_meta",
]

#: the engine facts that make a server the one a saved run measured (meta.engine keys)
IDENTITY_ENGINE_KEYS = ("name", "adapter", "version", "commit", "quantization", "dtype")
#: ... and its limits (meta.capacity keys)
IDENTITY_CAPACITY_KEYS = ("kv_tokens", "context_length", "max_running")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def verdict_meta(facts: EngineFacts, rules: Rules) -> dict[str, Any]:
    """meta["verdict"]: the engine facts and the rules the cells were judged by."""
    return {"facts": facts.to_dict(), "rules": rules.to_dict()}


def server_changes(meta: dict[str, Any], target: Any) -> list[str]:
    """What differs between the server a saved run measured (its ``meta``) and ``target``
    now, one short phrase each ("engine version 0.1 -> 0.2", "kv_tokens 16777216 -> 8000"):
    the engine, its version and build, the served model and the capacity limits. A fact
    unknown on either side is no evidence of a change and is not compared."""
    changes: list[str] = []

    def differ(what: str, was: Any, now: Any) -> None:
        if was is not None and now is not None and was != now:
            changes.append(f"{what} {_short(was)} -> {_short(now)}")

    saved_engine = meta.get("engine") or {}
    engine = target.engine_meta()
    for key in IDENTITY_ENGINE_KEYS:
        differ(
            "engine" if key == "name" else f"engine {key}", saved_engine.get(key), engine.get(key)
        )
    differ("model", (meta.get("target") or {}).get("model"), target.model)
    saved_caps = meta.get("capacity") or {}
    caps = target.capacity_meta()
    for key in IDENTITY_CAPACITY_KEYS:
        was = saved_caps.get(key)
        was_value = was.get("value") if isinstance(was, dict) else None
        differ(key, was_value, (caps.get(key) or {}).get("value"))
    return changes


def _short(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def capabilities(target: Any) -> tuple[dict[str, Any], list[str]]:
    """What the server can tell us and what it cannot (``meta.capabilities``), with one
    warning for each figure the run must do without instead of guessing it:

    - ``server_metrics``: a Prometheus endpoint answered; without it there is no
      server-side view of running, waiting or KV use in any cell;
    - ``server_queue_view``: the metrics carry a waiting count, so ``queued`` is read from
      the server; without it, from the client's view only (docs/metrics.md);
    - ``output_forced``: the engine can be made to produce exactly the max output;
    - ``kv_capacity``: where the KV capacity came from (probed, given, default, missing);
      missing means no cell can be judged over capacity before it is sent."""
    m = target.metrics
    has_metrics = bool(m.available and m.path and m.names())
    kv = target.capacity.get("kv_tokens")
    kv_source = kv.source if kv is not None and kv.value is not None else "missing"
    caps = {
        "server_metrics": has_metrics,
        "server_queue_view": bool(has_metrics and m.waiting),
        "output_forced": bool(target.output.forced),
        "kv_capacity": kv_source,
    }
    notes: list[str] = []
    if not has_metrics:
        notes.append(
            "the server gives no metrics: no server-side running, waiting or KV figures; "
            "queued cells are judged from the client's view only"
        )
    elif not m.waiting:
        notes.append(
            "the server's metrics have no waiting count: queued cells are judged from the "
            "client's view only"
        )
    if not target.output.forced:
        notes.append(
            "the engine cannot be made to produce exactly the max output: requests may end "
            "early (cells flagged output_not_forced)"
        )
    return caps, notes


def run_meta(url: str, target: Any, matrix: Any, info: dict, rules: Rules) -> dict:
    """The whole ``meta`` of a new run against `target` (a discovered Target)."""

    t = target
    tls = t.client_config.describe()
    caps, cap_notes = capabilities(t)
    warnings = list(t.warnings) + [w for w in cap_notes if w not in t.warnings]
    if tls["insecure"] and url.lower().startswith("https://"):
        warnings.append("TLS: the server's certificate was not verified (--insecure)")
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
            "served_model": served_model_name(t.model),
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
            # how https was verified: --insecure (none) or --ca-file (its file name only)
            "tls": tls,
            "matrix": matrix_dict,
            # the preset the matrix started from and how it differs ({} = not at all)
            "preset": info.get("preset"),
            "seed": int.from_bytes(os.urandom(4), "little"),
        },
        "capacity": t.capacity_meta(),
        "capabilities": caps,
        "warnings": warnings,
        "client": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        # this host's `speedmatrix selftest` (None: never run here); client_near_limit
        # and each cell's client_headroom read it
        "client_roofline": roofline_for_run(),
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
        # which capacity model decided over_capacity, its values and their sources
        "capacity_model": getattr(planned, "capacity_model", None),
        "cells": len(planned),
    }


def tokenizer_name(tokenizer: Any) -> str:
    for attr in ("name_or_path", "name"):
        name = getattr(tokenizer, attr, None)
        if isinstance(name, str) and name:
            return name
    return type(tokenizer).__name__
