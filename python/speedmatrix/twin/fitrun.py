"""`speedmatrix fit` / `sm.fit`: the built-in engine's profile fitted to a measured run.

From the run's raw records (`speedmatrix.twin.samples`): the decode step from every measured
decode cell's arrival gaps, batch and attended KV; the cold prefill from the warm-up requests
that ran alone; the KV pool, max running, context length and block size from what the run
discovered (``meta.capacity``, ``meta.run.plan``). The profile loads in ``speedmatrix sim
--profile`` as any other; its ``fit`` section (ignored by the engine) holds what the fit
measured: the cells it read, each parameter's standard deviation, the step parameters'
covariance and scatter (the prediction intervals of `speedmatrix.twin.model`) and the
residuals.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from speedmatrix.results import Run, load
from speedmatrix.twin.fit import PrefillFit, fit_prefill, fit_steps
from speedmatrix.twin.model import ProfileError, slot_passes
from speedmatrix.twin.samples import StepSample, prefill_samples, step_sample

__all__ = ["fit", "fit_run"]

#: statuses whose window measured the engine's steady decode
_MEASURED = ("valid", "queued")
#: engine defaults a fitted profile states (cpp/include/speedmatrix/sim.hpp)
_DEFAULT_CHUNK_TOKENS = 8192


def _capacity(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The pool and limits the run was planned with. A slot-bound engine
    (llama.cpp's split slots) may not state a pool: its slots' caches together stand for it
    (what llama.cpp allocates, ``-c``); `_rule` keeps its family and slot size."""
    cap = meta.get("capacity") or {}
    plan = (meta.get("run") or {}).get("plan") or {}
    model = plan.get("capacity_model") or {}
    values: dict[str, int | None] = {}
    for key in ("kv_tokens", "max_running", "context_length"):
        value = (cap.get(key) or {}).get("value") if isinstance(cap.get(key), dict) else None
        values[key] = plan.get(key) if value is None else value
    slot = model.get("slot_tokens")
    if values["kv_tokens"] is None and slot and values["max_running"]:
        values["kv_tokens"] = int(slot) * int(values["max_running"])
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            raise ProfileError(
                f"the run does not say the server's {key}; give it to `speedmatrix run` "
                f"(--{key.replace('_', '-').replace('kv-tokens', 'kv-capacity')}) and measure again"
            )
        out[key] = int(value)
    out["block_size"] = int(model.get("block_tokens") or 1)
    return out


def _rule(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The measured server's capacity rule when it is not the built-in engine's shared pool
    (the engine ignores it; the twin's statuses follow it): family and slot size."""
    model = ((meta.get("run") or {}).get("plan") or {}).get("capacity_model") or {}
    if model.get("family") in (None, "shared_pool"):
        return None
    rule: dict[str, Any] = {"family": str(model["family"])}
    if model.get("slot_tokens"):
        rule["slot_tokens"] = int(model["slot_tokens"])
    return rule


def _single_pass(
    samples: list[StepSample], rule: Mapping[str, Any] | None, slots: int
) -> tuple[list[StepSample], dict[str, str]]:
    """The samples whose step is one forward pass, and the cells left out with why: on split
    slot caches a partly busy batch runs in 1 to `slot_passes` passes by the slots the
    server gave it, which the records do not show, so its step pins no term."""
    family = (rule or {}).get("family")
    kept, left_out = [], {}
    for s in samples:
        passes = slot_passes(family, slots, s.concurrency)
        if passes == 1:
            kept.append(s)
        else:
            left_out[s.cell_id] = (
                f"{min(s.concurrency, slots)} of {slots} split slots busy: "
                f"1 to {passes} forward passes a step"
            )
    return kept, left_out


def _identity(meta: Mapping[str, Any], run: Run) -> dict[str, Any]:
    target = meta.get("target") or {}
    engine = meta.get("engine") or {}
    flavour = engine.get("adapter") if engine.get("adapter") in ("sglang", "vllm") else "vllm"
    return {
        "description": f"fitted by `speedmatrix fit` to {run.path or 'a run'} ({run.label})",
        "name": f"fit-{target.get('model') or 'server'}",
        "model": str(target.get("model") or "model"),
        "model_path": str(target.get("model_path") or target.get("model") or "model"),
        "flavour": flavour,
        "version": str(engine.get("version") or ""),
        "mode": "batched",
    }


def _prefill(run: Run, cells: list[dict]) -> PrefillFit | None:
    pairs = []
    for c in cells:
        rec = run.records(c["id"])
        if rec is not None:
            pairs.append((c, rec))
    samples = prefill_samples(pairs)
    return fit_prefill(samples) if samples else None


def fit_run(run: Run, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The profile fitted to ``run``; ``base``: a profile whose other fields (chunk budget,
    prefix cache, ...) the fitted one keeps. ProfileError when the run cannot pin the step."""
    meta = run.meta
    cells = [c for c in run.doc.get("cells") or [] if not c.get("predicted")]
    decode = [c for c in cells if c["phase"] == "decode" and c.get("status") in _MEASURED]
    decode = [c for c in decode if c.get("rate_per_s") is None]  # closed loop only
    samples = []
    for c in decode:
        rec = run.records(c["id"])
        sample = step_sample(c, rec) if rec is not None and rec.has_events() else None
        if sample is not None:
            samples.append(sample)
    profile: dict[str, Any] = {**_identity(meta, run), **dict(base or {})}
    profile.update(_capacity(meta))
    profile.setdefault("chunk_tokens", _DEFAULT_CHUNK_TOKENS)
    rule = _rule(meta)
    samples, left_out = _single_pass(samples, rule, int(profile["max_running"]))
    step = fit_steps(profile, samples)
    profile = step.profile
    matrix = (meta.get("run") or {}).get("matrix") or {}
    section: dict[str, Any] = {
        "run": str(run.path) if run.path else None,
        "cells": [s.cell_id for s in samples],
        "window_s": float(matrix.get("duration_s") or 30.0),
        "max_output": int(matrix.get("max_output") or 4096),
        "sd": dict(step.sd),
        "cov": step.cov,
        "scatter": step.scatter,
        "residuals": {"tbt_ms": {k: round(v, 6) for k, v in step.residuals.items()}},
    }
    if left_out:
        section["left_out"] = left_out
    if rule is not None:
        section["capacity"] = rule
    prefill = _prefill(run, cells)
    if prefill is not None:
        profile.update(prefill.params)
        profile["frontend_per_token_us"] = 0.0
        profile["prefill_chunk_overhead_ms"] = 0.0
        section["sd"].update(prefill.sd)
        section["residuals"]["cold_ttft_ms"] = {
            str(k): round(v, 6) for k, v in prefill.residuals.items()
        }
    else:
        section["not_fitted"] = ["prefill: no warm-up request ran alone"]
    profile["fit"] = section
    return profile


def fit(run: Run | str | os.PathLike[str], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`sm.fit`: `fit_run` of a run or a run folder."""
    return fit_run(run if isinstance(run, Run) else load(run), base)
