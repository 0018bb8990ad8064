"""Synthetic runs of a known engine profile, for the twin's fit tests (fast tier).

``engine_records(profile, context, n)`` plays a closed-loop decode cell the way the built-in
engine runs it (cpp/src/sim/engine.cpp): one warm-up request alone (its TTFT the profile's cold
prefill), then ``n`` window requests decoding in steps of ``step_ms(batch, kv)``, batch
``min(n, max_running)``, each step's time jittered by ``noise`` (a share). ``write_engine_run`` saves
such cells as a run folder (run.json + records) with the capacity a sweep would have probed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from speedmatrix.runfile import save_records, write_run
from speedmatrix.twin.model import cold_ttft_ms, status, step_ms
from speedmatrix.units import format_tokens
from synthetic import summarize

MS = 1_000_000
T_BASE = 7_000_000_000_000


def _requests(n_rows: int) -> dict[str, np.ndarray]:
    z64 = np.zeros(n_rows, np.int64)
    return {
        "slot": np.arange(n_rows, dtype=np.int32),
        "body": np.arange(n_rows, dtype=np.int32),
        "phase": np.zeros(n_rows, np.uint8),
        "scheduled_ns": z64.copy(),
        "sent_ns": z64.copy(),
        "first_byte_ns": z64.copy(),
        "first_token_ns": z64.copy(),
        "done_ns": z64.copy(),
        "http_status": np.full(n_rows, 200, np.int32),
        "prompt_tokens": z64.copy(),
        "output_tokens": z64.copy(),
        "token_source": np.zeros(n_rows, np.uint8),
        "outcome": np.zeros(n_rows, np.uint8),
        "finish_reason": np.array([""] * n_rows),
        "error_kind": np.array([""] * n_rows),
        "error_message": np.array([""] * n_rows),
        "retries": np.zeros(n_rows, np.int32),
    }


def engine_records(
    profile: dict[str, Any],
    context: int,
    n: int,
    *,
    window_s: float = 2.0,
    lead_steps: int = 4,
    noise: float = 0.0,
    seed: int = 0,
    t_start: int = T_BASE,
) -> tuple[dict, dict, int, int]:
    """(requests, events, window start, window end) of one decode cell of ``profile``."""
    rng = np.random.default_rng(seed)
    req = _requests(n + 1)
    cold_ns = int(cold_ttft_ms(profile, context) * MS)
    req["sent_ns"][0], req["first_token_ns"][0] = t_start, t_start + cold_ns
    req["done_ns"][0], req["output_tokens"][0] = t_start + cold_ns, 1
    req["prompt_tokens"][:] = context
    t = t_start + cold_ns + 50 * MS
    req["phase"][1:] = 1
    req["sent_ns"][1:] = t
    batch = min(n, int(profile["max_running"]))
    generated = np.zeros(batch, np.int64)
    ev_req, ev_t = [], []
    t0 = t1 = -1
    step = 0
    while t1 < 0 or t <= t1:
        kv = float(batch * context + generated.sum())
        dt = step_ms(profile, batch, kv) * (1 + noise * rng.standard_normal())
        t += int(dt * MS)
        generated += 1
        ev_req.extend(range(1, batch + 1))
        ev_t.extend([t] * batch)
        step += 1
        if step == lead_steps:
            t0 = t
            t1 = t0 + int(window_s * 1e9)
    running = slice(1, batch + 1)
    req["first_byte_ns"][running] = req["first_token_ns"][running] = ev_t[0]
    req["output_tokens"][running] = generated
    req["done_ns"][running] = t
    events = {
        "request": np.asarray(ev_req, np.int32),
        "t_ns": np.asarray(ev_t, np.int64),
        "tokens": np.ones(len(ev_t), np.int32),
        "server_ns": np.zeros(len(ev_t), np.int64),
    }
    return req, events, t0, t1


def write_engine_run(
    out: Path,
    profile: dict[str, Any],
    cells: list[tuple[int, int]],
    *,
    window_s: float = 2.0,
    max_output: int = 4096,
    noise: float = 0.0,
) -> Path:
    """A run folder of ``cells`` (context, concurrency) measured on ``profile``'s engine."""
    doc_cells = []
    t_start = T_BASE
    for i, (context, n) in enumerate(cells):
        cid = f"decode-c{context}-n{n}-r0"
        cell: dict[str, Any] = {
            "id": cid,
            "phase": "decode",
            "context": context,
            "label": format_tokens(context),
            "concurrency": n,
            "repetition": 0,
            "status": status(profile, context, n, max_output),
            "errors": {},
            "prompt_tok_s": None,
        }
        if cell["status"] != "over_capacity":
            req, ev, t0, t1 = engine_records(
                profile, context, n, window_s=window_s, noise=noise, seed=i, t_start=t_start
            )
            t_start = t1 + 10 * 10**9
            stamps = {"window_start_ns": t0, "window_end_ns": t1}
            cell["records"] = save_records(out, cid, req, ev, {}, stamps=stamps)
            cell.update({k: v for k, v in summarize(req, ev, t0, t1).items() if k != "bin_tok_s"})
            cell.update({"t0_ns": t0, "t1_ns": t1})
        else:
            cell.update(
                dict.fromkeys(
                    ["total_tok_s", "per_request_tok_s", "ttft_ms", "tbt_ms", "avg_active"]
                )
            )
            cell.update({"completed": None, "output_tokens": None, "measured_s": None})
        doc_cells.append(cell)
    cap = {
        k: {"value": profile[k], "source": "probed"}
        for k in ("kv_tokens", "max_running", "context_length")
    }
    matrix = {"duration_s": window_s, "max_output": max_output}
    plan = {"capacity_model": {"block_tokens": profile.get("block_size", 16)}}
    meta = {
        "target": {"model": "synthetic", "model_path": "org/synthetic"},
        "engine": {"name": "sglang", "adapter": "sglang", "version": "0.0-synthetic"},
        "capacity": cap,
        "run": {"duration_s": window_s, "max_output": max_output, "matrix": matrix, "plan": plan},
    }
    write_run(out, {"schema": "speedmatrix.run/1", "meta": meta, "cells": doc_cells})
    return out
