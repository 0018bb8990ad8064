"""Realistic synthetic saved runs for the report, results, plots and compare tests.

``build_run(dir, ...)`` writes ``dir/run.json`` and ``dir/records/*.npz`` for a
seed-shaped matrix on a modelled H200-class server: a prefill rate that falls
with context, decode steps that slow with batch and KV, a KV pool that makes the
big cells over capacity, a running cap that makes some cells queued, one error
cell, flagged cells, and optionally an interrupted run. The figures in
``run.json`` are computed from the records written beside them (by the
definitions of DESIGN.md, in numpy), so anything recomputed from the records
agrees with the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from speedmatrix.runfile import save_records, write_run

SEED_CONTEXTS = (8192, 16384, 32768, 65536, 125952)
SEED_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128)
SEED_PREFILL = (8192, 16384, 32768, 65536, 125952, 131072)
KV_TOKENS = 1_400_000
MAX_RUNNING = 48
API_KEY = "sk-synthetic-SECRET-0123456789"
HF_TOKEN = "hf_SyntheticHuggingFaceToken42"
SECRETS = [API_KEY, HF_TOKEN]  # what a sweep knows and replaces everywhere it writes
LAUNCH = (
    '"$HOME/env_h200/bin/sglang" serve --model-path meta-models/Muse-Glimmer-30B '
    "--served-model-name muse-glimmer --tp 1 --context-length 131072 "
    f"--mem-fraction-static 0.856257 --enable-metrics --host 0.0.0.0 --port 8000 "
    f"--api-key {API_KEY} --hf-token {HF_TOKEN}"
)
METRIC_NAMES = ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"]
T_BASE = 5_000_000_000_000  # monotonic clock origin of the run (ns)
MS = 1_000_000
ERROR_MESSAGE = f"HTTP 500: internal server error (upstream refused api_key={API_KEY})"
S = 1_000_000_000

# Which (context, concurrency) cells get which treatment.
ERROR_CELL = (32768, 16)
DRIFT_CELL = (8192, 16)
BUSY_CELL = (16384, 4)
MISMATCH_CELL = (65536, 2)
CLIENT_BOUND_CELL = (8192, 32)


def _f(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def summarize(req: dict, ev: dict, t0: int, t1: int, bin_s: float = 1.0) -> dict:
    """A synthetic cell's figures: the product's one derivation (`_core.summarize_cell`),
    in run.json's shape. Tests that hold the derivation against a hand computation do so
    on tiny records of their own (test_results.py, tests/cpp/test_stats.cpp)."""
    from speedmatrix._native import _core

    fig = _core.summarize_cell(req, ev, t0, t1, bin_s)

    def ci(name: str) -> list[float | None]:
        lo, hi = fig[f"{name}_ci"]
        return [_f(lo), _f(hi)]

    return {
        "measured_s": fig["measured_s"],
        "output_tokens": int(fig["output_tokens"]),
        "total_tok_s": fig["total_tok_s"],
        "tbt_ms": _f(fig["tbt_ms"]),
        "per_request_tok_s": _f(fig["per_request_tok_s"]),
        "ttft_ms": _f(fig["ttft_ms"]),
        "avg_active": fig["avg_active"],
        "completed": int(fig["completed"]),
        "started": int(fig["started"]),
        "errors_total": int(fig["errors"]),
        "ci": {k: ci(k) for k in ("total_tok_s", "tbt_ms", "per_request_tok_s", "ttft_ms")},
        "ttft_p90_ms": _f(fig["ttft_p90_ms"]),
        "ttft_p99_ms": _f(fig["ttft_p99_ms"]),
        "tbt_p90_ms": _f(fig["tbt_p90_ms"]),
        "tbt_p99_ms": _f(fig["tbt_p99_ms"]),
        "drift": fig["drift"],
        "bin_tok_s": list(fig["bin_tok_s"]),
    }


def prefill_rate(c: int) -> float:
    """Modelled cold prefill speed (prompt tok/s) at context ``c``."""
    return 10_600.0 - 17.0 * c / 1024


def decode_tbt_ms(c: int, n: int) -> float:
    return 16.8 + 0.12 * n + 0.004 * n * c / 1024


def warm_ttft_ms(c: int, n: int) -> float:
    return 80.0 + 0.8 * n * c / 1024


def _label(c: int) -> str:
    return f"{round(c / 1024)}K"


class _Cell:
    """Accumulates the records of one cell."""

    def __init__(self) -> None:
        self.req = {
            k: []
            for k in (
                "slot",
                "body",
                "phase",
                "scheduled_ns",
                "sent_ns",
                "first_byte_ns",
                "first_token_ns",
                "done_ns",
                "http_status",
                "prompt_tokens",
                "output_tokens",
                "token_source",
                "outcome",
                "finish_reason",
                "error_kind",
                "error_message",
            )
        }
        self.ev_request: list[np.ndarray] = []
        self.ev_t: list[np.ndarray] = []
        self.ev_tok: list[np.ndarray] = []

    def add(
        self,
        slot,
        phase,
        sent,
        ft,
        done,
        prompt,
        outcome,
        ev_t=None,
        ev_tok=None,
        status=200,
        kind="",
        message="",
        finish="",
    ):
        i = len(self.req["slot"])
        n_out = 0
        if ev_t is not None and len(ev_t):
            self.ev_request.append(np.full(len(ev_t), i, np.int32))
            self.ev_t.append(np.asarray(ev_t, np.int64))
            self.ev_tok.append(np.asarray(ev_tok, np.int32))
            n_out = int(np.sum(ev_tok))
        vals = {
            "slot": slot,
            "body": slot,
            "phase": phase,
            "scheduled_ns": sent,
            "sent_ns": sent,
            "first_byte_ns": ft - MS if ft >= 0 else (sent + MS if status != 200 else -1),
            "first_token_ns": ft,
            "done_ns": done,
            "http_status": status,
            "prompt_tokens": prompt,
            "output_tokens": n_out,
            "token_source": 1 if n_out else 0,
            "outcome": outcome,
            "finish_reason": finish,
            "error_kind": kind,
            "error_message": message,
        }
        for k, v in vals.items():
            self.req[k].append(v)

    def arrays(self):
        dt = {
            "slot": np.int32,
            "body": np.int32,
            "phase": np.uint8,
            "http_status": np.int32,
            "prompt_tokens": np.int64,
            "output_tokens": np.int64,
            "token_source": np.uint8,
            "outcome": np.uint8,
        }
        req = {}
        for k, v in self.req.items():
            if k in ("finish_reason", "error_kind", "error_message"):
                req[k] = np.asarray(v, dtype=np.str_)
            else:
                req[k] = np.asarray(v, dtype=dt.get(k, np.int64))
        if self.ev_t:
            ev = {
                "request": np.concatenate(self.ev_request),
                "t_ns": np.concatenate(self.ev_t),
                "tokens": np.concatenate(self.ev_tok),
            }
        else:
            ev = {
                "request": np.zeros(0, np.int32),
                "t_ns": np.zeros(0, np.int64),
                "tokens": np.zeros(0, np.int32),
            }
        ev["server_ns"] = np.full(len(ev["t_ns"]), -1, np.int64)
        return req, ev


def _stream(
    rng,
    start_ns: int,
    end_ns: int,
    tbt_ms: float,
    max_tokens: int,
    drift: float = 0.0,
    jitter: float = 0.12,
):
    """Token events of one request from its first token until ``end_ns`` or ``max_tokens``."""
    n = max(1, int((end_ns - start_ns) / (tbt_ms * MS) * 1.3) + 4)
    n = min(n, max_tokens)
    gaps = tbt_ms * np.clip(1 + jitter * rng.standard_normal(n), 0.3, 3.0)
    if drift:
        gaps = gaps * (1 + drift * np.linspace(0, 1, n))
    gaps[0] = 0
    t = start_ns + np.cumsum(gaps * MS).astype(np.int64)
    tok = np.where(rng.random(n) < 0.05, 2, 1).astype(np.int32)
    csum = np.cumsum(tok)
    keep = (t <= end_ns) & (csum <= max_tokens)
    return t[keep], tok[keep]


def _decode_cell(
    rng,
    c: int,
    n: int,
    t_start: int,
    duration_s: float,
    max_output: int,
    error: bool,
    drift: float,
    prompt_extra: int,
    speed: float = 1.0,
):
    cell = _Cell()
    tbt = decode_tbt_ms(c, n) / speed
    ttft = warm_ttft_ms(c, n) / speed
    cold = c / prefill_rate(c) * 1000
    # warm-up: N cold prompts, one token each
    for s in range(n):
        sent = t_start + s * 2 * MS
        ft = sent + int((cold * (1 + 0.3 * s / max(n, 1))) * MS)
        cell.add(s, 0, sent, ft, ft + MS, c + prompt_extra, 1, [ft], [1], finish="length")
    t0 = max(cell.req["done_ns"]) + 20 * MS
    t1 = t0 + int(duration_s * S)
    for s in range(n):
        sent = t0
        while sent < t1:
            if error and s % 3 == 0:
                done = sent + 40 * MS
                # a server that echoes a credential in its error (redaction must catch it)
                cell.add(
                    s, 1, sent, -1, done, -1, 3, status=500, kind="http_500", message=ERROR_MESSAGE
                )
                sent = done + 200 * MS
                continue
            wait = max(0, s - MAX_RUNNING + 1) * 0.5 * ttft if n > MAX_RUNNING else 0.0
            ft = sent + int((ttft * (0.8 + 0.4 * rng.random()) + wait) * MS)
            if ft > t1:
                cell.add(s, 1, sent, -1, t1, c + prompt_extra, 2)
                break
            t, tok = _stream(rng, ft, t1, tbt * (1 + 0.05 * (s % 3)), max_output, drift)
            finished = int(tok.sum()) >= max_output
            done = int(t[-1]) + MS if finished else t1
            cell.add(
                s,
                1,
                sent,
                ft,
                done,
                c + prompt_extra,
                1 if finished else 2,
                t,
                tok,
                finish="length" if finished else "",
            )
            if not finished:
                break
            sent = done
    # /metrics samples every 250 ms
    ts = np.arange(t0 - S // 2, t1 + S // 4, S // 4, dtype=np.int64)
    running = np.where((ts >= t0) & (ts <= t1), min(n, MAX_RUNNING), 0).astype(float)
    waiting = np.where((ts >= t0) & (ts <= t1), max(0, n - MAX_RUNNING), 0).astype(float)
    usage = running * (c + 200) / KV_TOKENS
    metrics = {
        "names": METRIC_NAMES,
        "t_ns": ts,
        "values": np.stack([running, waiting, usage], axis=1),
        "failures": 0,
    }
    req, ev = cell.arrays()
    return req, ev, metrics, t0, t1


def build_run(
    out_dir: str | Path,
    contexts=SEED_CONTEXTS,
    concurrency=SEED_CONCURRENCY,
    prefill_contexts=SEED_PREFILL,
    duration_s: float = 8.0,
    max_output: int = 4096,
    interrupted: bool = False,
    keep_cells: int | None = None,
    seed: int = 0,
    speed: float = 1.0,
    with_records: bool = True,
    errors: bool = True,
    engine_version: str = "0.5.6.post3.dev9265+g05c584c44",
) -> dict:
    """Write a synthetic run into ``out_dir`` and return its run.json document.

    ``interrupted`` keeps only the first ``keep_cells`` cells (default: about
    half) and marks the run interrupted. ``speed`` scales decode speed (a
    faster build for compare tests).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cells: list[dict] = []
    t = T_BASE
    for c in prefill_contexts:
        ttft = c / prefill_rate(c) * 1000 / speed * (1 + 0.01 * rng.standard_normal())
        cid = f"prefill-c{c}-r0"
        cell = {
            "id": cid,
            "phase": "prefill",
            "context": c,
            "concurrency": 1,
            "repetition": 0,
            "label": _label(c),
            "status": "valid",
            "total_tok_s": None,
            "per_request_tok_s": None,
            "prompt_tok_s": c / (ttft / 1000),
            "ttft_ms": ttft,
            "tbt_ms": None,
            "avg_active": None,
            "completed": 1,
            "output_tokens": 1,
            "measured_s": ttft / 1000,
            "errors": {},
            "started": 1,
            "errors_total": 0,
            "flags": [],
            "server": None,
            "prompt_tokens": {"asked": c, "reported_min": c, "reported_max": c, "exact": True},
            "t0_ns": t,
            "t1_ns": t + int(ttft * MS),
        }
        if with_records:
            pc = _Cell()
            ft = t + int(ttft * MS)
            pc.add(0, 0, t, ft, ft + MS, c, 1, [ft], [1], finish="length")
            req, ev = pc.arrays()
            cell["records"] = save_records(out, cid, req, ev, {}, secrets=SECRETS)
        cells.append(cell)
        t += int(ttft * MS) + 50 * MS
    for c in contexts:
        for n in concurrency:
            cid = f"decode-c{c}-n{n}-r0"
            base = {
                "id": cid,
                "phase": "decode",
                "context": c,
                "concurrency": n,
                "repetition": 0,
                "label": _label(c),
                "prompt_tok_s": None,
            }
            need = n * (c + max_output)
            if need > KV_TOKENS:
                cells.append(
                    {
                        **base,
                        "status": "over_capacity",
                        "total_tok_s": None,
                        "per_request_tok_s": None,
                        "ttft_ms": None,
                        "tbt_ms": None,
                        "avg_active": None,
                        "completed": 0,
                        "output_tokens": 0,
                        "measured_s": 0.0,
                        "errors": {},
                        "flags": [],
                        "server": None,
                        "reason": f"{n} × ({c:,} + {max_output:,}) = {need:,} tokens "
                        f"> KV capacity {KV_TOKENS:,}",
                    }
                )
                continue
            is_err = errors and (c, n) == ERROR_CELL
            drift = 0.25 if (c, n) == DRIFT_CELL else 0.0
            extra = 3 if (c, n) == MISMATCH_CELL else 0
            req, ev, met, t0, t1 = _decode_cell(
                rng, c, n, t, duration_s, max_output, is_err, drift, extra, speed
            )
            fig = summarize(req, ev, t0, t1)
            kinds: dict[str, int] = {}
            examples: dict[str, str] = {}  # the first server message of each kind
            for k, ph, msg in zip(
                req["error_kind"].tolist(), req["phase"].tolist(), req["error_message"].tolist()
            ):
                if k and ph == 1:
                    kinds[k] = kinds.get(k, 0) + 1
                    examples.setdefault(k, msg)
            status = "valid"
            reason = None
            if is_err:
                status, reason = "error", "too many failed requests"
            elif n > MAX_RUNNING:
                status, reason = "queued", f"server reported up to {n - MAX_RUNNING} waiting"
            flags = []
            if abs(fig["drift"]) > 0.05 and drift:
                flags.append("drift")
            if (c, n) == BUSY_CELL:
                flags.append("busy_at_start")
            if extra:
                flags.append("prompt_mismatch")
            if (c, n) == CLIENT_BOUND_CELL:
                flags.append("client_bound")
            run_v = met["values"][:, 0][(met["t_ns"] >= t0) & (met["t_ns"] <= t1)]
            wait_v = met["values"][:, 1][(met["t_ns"] >= t0) & (met["t_ns"] <= t1)]
            kv_v = met["values"][:, 2]
            cell = {
                **base,
                "status": status,
                **{k: v for k, v in fig.items() if k != "bin_tok_s"},
                "errors": kinds,
                "flags": flags,
                "t0_ns": t0,
                "t1_ns": t1,
                "server": {
                    "running_mean": float(run_v.mean()),
                    "running_max": float(run_v.max()),
                    "waiting_max": float(wait_v.max()),
                    "kv_usage_max": float(kv_v.max()),
                },
                "prompt_tokens": {
                    "asked": c,
                    "reported_min": c + extra,
                    "reported_max": c + extra,
                    "exact": extra == 0,
                },
            }
            if reason:
                cell["reason"] = reason
            if examples:
                cell["error_examples"] = examples
            if with_records:
                cell["records"] = save_records(out, cid, req, ev, met, secrets=SECRETS)
            cells.append(cell)
            t = t1 + 200 * MS
    if interrupted:
        keep = keep_cells if keep_cells is not None else len(cells) // 2
        cells = cells[:keep]
        if cells:
            cells[-1].setdefault("flags", []).append("interrupted")
    doc = {
        "schema": "speedmatrix.run/1",
        "meta": {
            # what discovery records for the seed's server: the model path SGLang reports
            # (the report's title derives the model's name from it), facts and their sources
            "target": {
                "url": "http://127.0.0.1:8000/v1",
                "model": "muse-glimmer",
                "api": "completions",
                "model_path": "meta-models/Muse-Glimmer-30B",
            },
            "engine": {
                "name": "sglang",
                "adapter": "sglang",
                "version": engine_version,
                "commit": "05c584c44fb0",
                "quantization": None,
                "dtype": "bfloat16",
                "backend": "cuda",
                "build": "cuda-13.2",
                "repository": "github.com/sgl-project/sglang",
                "model_path": "meta-models/Muse-Glimmer-30B",
                "tp_size": 1,
                "simulated": False,
                "sources": {
                    "name": "probed",
                    "version": "probed",
                    "commit": "probed",
                    "backend": "given",
                    "build": "given",
                    "repository": "default",
                },
            },
            "hardware": {
                "type": "Discrete GPU",
                "gpu": "H200 NVL",
                "vram_gb": 141,
                "os": "linux",
                "cpu": "Synthetic CPU @ 3.0GHz",
                "sources": {
                    "type": "detected",
                    "gpu": "detected",
                    "vram_gb": "detected",
                    "os": "given",
                    "cpu": "detected",
                },
            },
            "run": {
                "served_model": "muse-glimmer",
                "revision": "main",
                "tool": "speedmatrix",
                "tool_version": "0.1.0",
                "decode_test": "fixed_duration",
                "prefill_mode": "decode_warmup",
                "duration_s": duration_s,
                "max_output": max_output,
                "started_at": "2026-12-02T10:00:00Z",
                "finished_at": None if interrupted else "2026-12-02T10:30:00Z",
                "interrupted": interrupted,
                "launch_command": LAUNCH,
                "api_key_used": API_KEY,
                "matrix": {
                    "contexts": list(contexts),
                    "concurrency": list(concurrency),
                    "prefill_contexts": list(prefill_contexts),
                    "duration_s": duration_s,
                    "max_output": max_output,
                },
            },
            "capacity": {
                "kv_tokens": {"value": KV_TOKENS, "source": "probed"},
                "context_length": {"value": 131072, "source": "probed"},
                "max_running": {"value": MAX_RUNNING, "source": "given"},
            },
            "client": {"host": "bench-client", "cpus": 16},
        },
        "cells": cells,
    }
    write_run(out, doc, secrets=SECRETS)
    from speedmatrix.runfile import read_run

    return read_run(out)


_SHARED: dict[str, Path] = {}
_SHARED_ROOT: list[Path] = []


def shared_run(name: str = "full", report: bool = False, **kwargs) -> Path:
    """A synthetic run built once per test process (read-only for callers: copy to modify).

    ``name`` picks the variant: "full" (the seed-shaped matrix), "interrupted",
    "faster" (10% faster, other seed), "norecords"; ``report`` also writes its report.
    """
    import atexit
    import shutil
    import tempfile

    key = name + (":report" if report else "")
    if key in _SHARED:
        return _SHARED[key]
    if not _SHARED_ROOT:
        root = Path(tempfile.mkdtemp(prefix="speedmatrix-synthetic-"))
        _SHARED_ROOT.append(root)
        atexit.register(shutil.rmtree, root, True)
    path = _SHARED_ROOT[0] / key.replace(":", "-")
    variants = {
        "full": {},
        "interrupted": {"interrupted": True},
        "faster": {"speed": 1.1, "seed": 1, "engine_version": "0.5.7"},
        "norecords": {"with_records": False},
    }
    build_run(path, **{**variants.get(name, {}), **kwargs})
    if report:
        from speedmatrix.report import write_report

        write_report(path)
    _SHARED[key] = path
    return path
