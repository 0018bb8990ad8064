"""A predicted matrix as a run: the same run.json and frame as a measured run, every cell
marked ``predicted: true`` with its interval (``*_low`` / ``*_high``).

`predicted_doc` builds the run.json document, `predict` (`sm.predict`) returns it as a
`speedmatrix.results.Run` and, given ``out``, writes it as a run folder (no records: nothing
was measured). The model and its limits (`LIMITS`) travel in ``meta.run.prediction`` so the
report can say them beside every predicted cell.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from speedmatrix.plan import decode_max
from speedmatrix.results import Run
from speedmatrix.runfile import write_run
from speedmatrix.sim import load_profile
from speedmatrix.twin.model import PredictedCell, predict_cell
from speedmatrix.units import format_tokens, parse_tokens

__all__ = [
    "LIMITS",
    "apply_overrides",
    "predict",
    "predicted_cell",
    "predicted_doc",
    "with_predictions",
]

#: where the model is known to fail, said beside every predicted cell (docs/metrics.md)
LIMITS = (
    "predicted by the built-in engine's model (continuous batching, one token per step, "
    "no prefix-cache reuse, no work left from earlier cells); it fails for speculative "
    "decoding, prefix-cache effects and servers that preempt"
)


def apply_overrides(profile: dict[str, Any], items: Iterable[str]) -> None:
    """What-ifs ``KEY=VALUE`` or ``KEY=Nx`` (N times the profile's value), in place;
    ValueError names the bad item."""
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in profile or key == "fit":
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with a profile field as KEY")
        try:
            base = float(profile[key])
            new = base * float(value[:-1]) if value.endswith("x") else float(value)
        except (TypeError, ValueError):
            raise ValueError(f"--set {item!r}: VALUE must be a number or Nx") from None
        profile[key] = int(new) if isinstance(profile[key], int) else new


def predicted_cell(p: PredictedCell, max_running: int, window_s: float) -> dict[str, Any]:
    """One predicted decode cell as run.json writes a cell."""
    over = p.status == "over_capacity"
    out_tokens = None if over or p.total_tok_s is None else round(p.total_tok_s * window_s)
    return {
        "id": f"decode-c{p.context}-n{p.concurrency}-r0",
        "phase": "decode",
        "context": p.context,
        "label": format_tokens(p.context),
        "concurrency": p.concurrency,
        "repetition": 0,
        "status": p.status,
        "predicted": True,
        "total_tok_s": p.total_tok_s,
        "total_tok_s_low": p.total_tok_s_low,
        "total_tok_s_high": p.total_tok_s_high,
        "per_request_tok_s": None if p.tbt_ms is None else 1000.0 / p.tbt_ms,
        "prompt_tok_s": None,
        "ttft_ms": None,
        "tbt_ms": p.tbt_ms,
        "tbt_ms_low": p.tbt_ms_low,
        "tbt_ms_high": p.tbt_ms_high,
        "avg_active": None if over else float(min(p.concurrency, max_running)),
        "completed": None,
        "output_tokens": out_tokens,
        "measured_s": 0.0,
        "errors": {},
        "flags": [],
        "reason": "over capacity (the sweep's KV rule)" if over else _reason(p, max_running),
    }


def _reason(p: PredictedCell, max_running: int) -> str:
    if p.slot_passes <= 1:
        return "predicted, not measured"
    batch = min(p.concurrency, max_running)
    return (
        f"predicted, not measured; split slot caches batch only consecutive slots, so these "
        f"{batch} requests take 1 to {p.slot_passes} forward passes a step by the slots the "
        "server gives them; the interval spans both, from one request's step to a full "
        "batch's"
    )


def _resolve_contexts(
    contexts: Iterable[int | str], profile: Mapping[str, Any], max_output: int
) -> list[int]:
    out = []
    for c in contexts:
        if c == "max":
            c = decode_max(int(profile.get("context_length", 0)), max_output)
        out.append(parse_tokens(c))
    return out


def predicted_doc(
    profile: Mapping[str, Any],
    contexts: Iterable[int | str],
    concurrency: Iterable[int],
    *,
    max_output: int | None = None,
    window_s: float | None = None,
    source: str = "",
) -> dict[str, Any]:
    """The run.json document of the predicted matrix; window and max output default to the
    fit's (the run it was fitted to), else 30 s and 4,096 tokens."""
    fit = profile.get("fit") or {}
    window_s = float(window_s or fit.get("window_s") or 30.0)
    max_output = int(max_output or fit.get("max_output") or 4096)
    ctx = _resolve_contexts(contexts, profile, max_output)
    levels = [int(n) for n in concurrency]
    max_running = int(profile.get("max_running", 1 << 30))
    cells = [
        predicted_cell(
            predict_cell(profile, c, n, max_output=max_output, window_s=window_s),
            max_running,
            window_s,
        )
        for c in ctx
        for n in levels
    ]
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    prediction = {
        "profile": source or str(profile.get("name") or "profile"),
        "fitted_to": fit.get("run"),
        "fitted_cells": list(fit.get("cells") or []),
        "limits": LIMITS,
        "model": "docs/metrics.md, Predicted cells",
    }
    return {
        "schema": "speedmatrix.run/1",
        "meta": {
            "target": {
                "url": None,
                "model": profile.get("model"),
                "model_path": profile.get("model_path"),
            },
            "engine": {"name": "speedmatrix twin (predicted)", "version": profile.get("version")},
            "capacity": {k: profile.get(k) for k in ("kv_tokens", "context_length", "max_running")},
            "run": {
                "duration_s": window_s,
                "max_output": max_output,
                "interrupted": False,
                "started_at": now,
                "matrix": {"contexts": ctx, "concurrency": levels, "prefill_contexts": []},
                "prediction": prediction,
            },
        },
        "cells": cells,
    }


def predict(
    profile: str | os.PathLike[str] | Mapping[str, Any],
    contexts: Iterable[int | str],
    concurrency: Iterable[int],
    *,
    max_output: int | None = None,
    window_s: float | None = None,
    overrides: Iterable[str] = (),
    out: str | os.PathLike[str] | None = None,
) -> Run:
    """`sm.predict`: the predicted matrix of ``profile`` (a shipped name, a .json path or a
    fitted profile's dict) as a Run whose cells carry ``predicted: true``; ``overrides``:
    what-ifs (``"kv_tokens=2x"``); ``out``: also written there as a run folder."""
    if isinstance(profile, Mapping):
        prof, source = dict(profile), str(profile.get("name") or "profile")
    else:
        prof, source = load_profile(profile), str(profile)
    apply_overrides(prof, overrides)
    doc = predicted_doc(
        prof, contexts, concurrency, max_output=max_output, window_s=window_s, source=source
    )
    if out is not None:
        write_run(out, doc)
    return Run(doc, out)


def with_predictions(
    doc: Mapping[str, Any],
    profile: Mapping[str, Any],
    contexts: Iterable[int],
    concurrency: Iterable[int],
    *,
    source: str = "",
) -> dict[str, Any]:
    """A measured run's document with every (context, concurrency) decode cell it did not
    measure added as predicted (``profile``: fitted to it); its measured cells untouched."""
    run = dict(doc)
    meta = dict(run.get("meta") or {})
    info = dict(meta.get("run") or {})
    window_s = float(info.get("duration_s") or 30.0)
    max_output = int(info.get("max_output") or 4096)
    measured = {
        (int(c["context"]), int(c["concurrency"]))
        for c in run.get("cells") or []
        if c.get("phase") == "decode" and not c.get("predicted")
    }
    pred = predicted_doc(
        profile, contexts, concurrency, max_output=max_output, window_s=window_s, source=source
    )
    new = [c for c in pred["cells"] if (c["context"], c["concurrency"]) not in measured]
    kept = [c for c in run.get("cells") or [] if not c.get("predicted")]
    info["prediction"] = pred["meta"]["run"]["prediction"]
    meta["run"] = info
    run["meta"] = meta
    run["cells"] = kept + new
    return run
