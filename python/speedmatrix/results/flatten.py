"""A run.json cell as one flat row of `Run.cells`: its figures, intervals (``*_lo``,
``*_hi``), server gauges (``server_*``) and latency distributions as columns, each named
once in `speedmatrix.figures`; and the names of statuses and record codes shown in frames."""

from __future__ import annotations

from typing import Any

import numpy as np

from speedmatrix import figures
from speedmatrix.units import format_tokens

STATUS_TEXT = {
    "over_capacity": "Over capacity",
    "error": "Error",
    "queued": "Requests queued",
    "valid": "Valid",
}
NOT_MEASURED = "Not measured"
OUTCOME_TEXT = {0: "pending", 1: "ok", 2: "cancelled", 3: "error"}
PHASE_TEXT = {0: "warmup", 1: "window"}
CI_FIGURES = figures.CI_FIGURES
FIGURE_ALIASES = {
    "ttft": "ttft_ms",
    "tbt": "tbt_ms",
    "total": "total_tok_s",
    "per_request": "per_request_tok_s",
    "prompt": "prompt_tok_s",
    "active": "avg_active",
}


def context_label(c: int) -> str:
    """A context as the report writes it (``8K``)."""
    return format_tokens(int(c))


def id_of_cell(cell: dict) -> str:
    """A cell's id: saved, else phase-c<context>-n<concurrency>-r<repetition> (older runs)."""
    if "id" in cell:
        return cell["id"]
    return f"{cell['phase']}-c{cell['context']}-n{cell['concurrency']}-r{cell.get('repetition', 0)}"


def flatten_cell(cell: dict) -> dict:
    """One row of `Run.cells` from a run.json cell."""
    row: dict[str, Any] = {}
    for k, v in cell.items():
        if k == "ci" and isinstance(v, dict):
            for fig, iv in v.items():
                lo, hi = iv if isinstance(iv, (list, tuple)) and len(iv) == 2 else (None, None)
                row[f"{fig}_lo"] = np.nan if lo is None else float(lo)
                row[f"{fig}_hi"] = np.nan if hi is None else float(hi)
        elif k == "server":
            for sk in ("running_mean", "running_max", "waiting_max", "kv_usage_max"):
                sv = v.get(sk) if isinstance(v, dict) else None
                row[f"server_{sk}"] = np.nan if sv is None else float(sv)
            for sk, sv in v.items() if isinstance(v, dict) else ():
                row.setdefault(f"server_{sk}", sv)
        elif k == "latency" and isinstance(v, dict):
            flatten_latency(v, row)
        elif isinstance(v, dict) and k not in ("errors", "error_examples"):  # {kind: ...}
            for pk, pv in v.items():
                row[f"{k}_{pk}"] = pv
        else:
            row[k] = v
    row.setdefault("id", id_of_cell(cell))
    row.setdefault("repetition", 0)
    if not row.get("label"):
        row["label"] = context_label(cell["context"])
    row.setdefault("flags", [])
    if row["flags"] is None:
        row["flags"] = []
    errs = row.get("errors") or {}
    row["errors"] = errs
    row.setdefault("errors_total", int(sum(errs.values())) if isinstance(errs, dict) else 0)
    return row


def flatten_latency(latency: dict, row: dict) -> None:
    """run.json's latency distributions as columns: e2e_ms -> e2e_n, e2e_mean_ms, e2e_p99_ms,
    ... (the intervals stay in run.json). One name per figure (`figures`): the median is the
    p50; the TTFT distribution of completed requests is ``ttft_completed_*`` (``ttft_ms`` is
    over the requests sent); the TBT distribution's p50, p90 and p99 are the core's own
    ``tbt_ms``, ``tbt_p90_ms``, ``tbt_p99_ms`` (the same gaps) and are not written twice."""
    for name, dist in latency.items():
        if not isinstance(dist, dict):
            continue
        base = name.removesuffix("_ms")
        prefix = figures.DISTRIBUTION_PREFIX.get(base, base)
        for dk, dv in dist.items():
            if dk == "median" and "p50" not in dist:
                dk = "p50"
            if dk == "n":
                col = f"{prefix}_n"
            elif dk == "mean" or (dk.startswith("p") and dk[1:2].isdigit()):
                col = f"{prefix}_{dk}_ms"
            else:
                continue
            # a column the core writes (the TBT percentiles of the same gaps) is its own
            known = figures.find(col)
            if col == "tbt_p50_ms" or col in row or (known is not None and known.by == "core"):
                continue
            row[col] = np.nan if dv is None else dv
