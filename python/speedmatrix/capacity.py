"""Capacity models per engine family: whether a planned cell fits what the server can hold.

Pure: no I/O. :func:`model_for` builds a :class:`CapacityModel` from a Target's facts (its
engine, capacity figures and ``info``); :meth:`CapacityModel.check` says whether a cell of
context C, concurrency N and max output O is ``over_capacity`` and why. docs/metrics.md
("Capacity models") states each rule with its source.

Families:

- ``shared_pool`` (SGLang's token pool, vLLM's KV blocks, TRT-LLM, LMDeploy, any engine
  whose only figure is a KV token total): the requests running at once share one pool.
  Over capacity when min(N, max running) × (C + O) > pool, each request's C + O rounded up
  to whole KV blocks where the engine allocates in blocks (vLLM ``block_size``, SGLang
  ``page_size``). Max running unknown: an engine that counts its preemptions (vLLM) has
  the cells that would need it run and judged from what it did (``Fit.judged`` "measured":
  preemptions = over capacity); any other takes N.
- ``per_slot`` (llama.cpp with split slot caches, or whose layout it does not state): each
  of K slots has its own cache of n_ctx / K tokens (unknown layout: only this rule, the
  pool being judged by the server's refusals, speedmatrix.verdict.refusal). A request that
  does not fit its slot is refused (C + O > slot); N above K waits for a free slot (queued,
  never over capacity).
- ``unified_slots`` (llama.cpp's default: 4 slots over one unified pool): only the
  min(N, slots) requests running at once hold KV. Over capacity when
  min(N, slots) × (C + O) > pool; N above the slots with requests that fit is queued.
- ``tokens_in_flight`` (TGI, Ollama): the engine caps tokens per request (TGI
  ``max_total_tokens``; Ollama the loaded context) and the number it runs at once (TGI
  ``max_batch_size``, Ollama ``num_parallel``). Over capacity when C + O > the per-request
  cap, or when a batch token budget is known (TGI ``max_batch_total_tokens``) and
  min(N, running cap) × (C + O) exceeds it; N above the running cap queues.
- ``unknown``: no figure: no cell is over capacity (the plan warns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAMILIES", "CapacityModel", "Fit", "model_for"]

FAMILIES = ("shared_pool", "per_slot", "unified_slots", "tokens_in_flight", "unknown")

#: engines whose requests share one KV pool
_SHARED_POOL_ENGINES = ("sglang", "vllm", "trtllm", "lmdeploy", "sim", "generic")


@dataclass(frozen=True)
class Fit:
    """Verdict of one cell: ``status`` None (fits) or ``"over_capacity"``; ``queued`` when N
    exceeds what the engine runs at once; ``kv_needed`` the tokens the rule compared."""

    status: str | None
    reason: str = ""
    queued: bool = False
    kv_needed: int = 0
    #: "" when the rule decided; "measured" when it could not (max running unknown) and
    #: the cell is run and judged from the server's running, waiting and preemptions
    judged: str = ""
    #: the share of the pool one request's prompt takes (whole blocks): a server whose
    #: free KV stays below it while requests wait is out of KV, not of running slots
    admit_share: float = 0.0


@dataclass(frozen=True)
class CapacityModel:
    """One engine family's capacity rule and the values it uses.

    ``pool_tokens``: tokens shared by the running requests (shared_pool, unified_slots).
    ``slot_tokens``: tokens one request may hold (per_slot: its slot; tokens_in_flight: the
    per-request cap). ``slots``: requests the engine runs at once (None = no limit known).
    ``sources``: where each value came from, e.g. ``{"pool_tokens": "probed: /props ..."}``.
    """

    family: str
    pool_tokens: int | None = None
    slot_tokens: int | None = None
    slots: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    note: str = ""
    #: tokens per KV block (vLLM block_size, SGLang page_size): a request holds whole blocks
    block_tokens: int | None = None
    #: max running unknown and the engine counts preemptions: cells whose fit depends on
    #: it are run and judged from the measurement instead of refused
    measure_unknown_running: bool = False

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown capacity family {self.family!r}")

    def running(self, n: int) -> int:
        """Requests of a cell with concurrency ``n`` that run (and hold KV) at once."""
        return min(n, self.slots) if self.slots else n

    def check(self, context: int, n: int, output: int) -> Fit:
        """Whether a cell of ``n`` concurrent requests of ``context`` + ``output`` tokens
        fits. A prefill cell is ``n`` = 1, ``output`` = 1."""
        per_request = self.held(context + output)
        queued = self.slots is not None and n > self.slots
        running = self.running(n)
        slot_bound = self.family in ("per_slot", "tokens_in_flight")
        if slot_bound and self.slot_tokens is not None and per_request > self.slot_tokens:
            what = "slot's KV cache" if self.family == "per_slot" else "per-request token cap"
            return Fit(
                "over_capacity",
                f"{context} + {output} = {per_request:,} tokens > the {what} "
                f"{self.slot_tokens:,} tokens (refused whatever the concurrency)",
                queued,
                per_request,
            )
        need = running * per_request
        if self.pool_tokens is not None and need > self.pool_tokens:
            if self.measure_unknown_running and not self.slots and per_request <= self.pool_tokens:
                return Fit(
                    None,
                    f"max running unknown: {n} × {self._tokens(context, output)} = {need:,} "
                    f"tokens would exceed the KV capacity {self.pool_tokens:,} only if all "
                    f"{n} run at once; run and judged from the server's running, waiting "
                    "and preemptions",
                    False,
                    need,
                    judged="measured",
                    admit_share=self.held(context) / self.pool_tokens,
                )
            if self.slots and n > self.slots:
                who = "slots" if self.family == "unified_slots" else "max running"
                run = f"min({n}, {who} {self.slots})"
            else:
                run = str(n)
            pool = "unified KV pool" if self.family == "unified_slots" else "KV capacity"
            return Fit(
                "over_capacity",
                f"{run} × {self._tokens(context, output)} = {need:,} tokens > {pool} "
                f"{self.pool_tokens:,} tokens",
                queued,
                need,
            )
        return Fit(None, "", queued, need)

    def held(self, tokens: int) -> int:
        """KV tokens a request of ``tokens`` holds: whole blocks where the engine has them."""
        b = self.block_tokens
        return -(-tokens // b) * b if b and b > 1 else tokens

    def _tokens(self, context: int, output: int) -> str:
        raw = f"({context} + {output})"
        held = self.held(context + output)
        if held == context + output:
            return raw
        return f"{raw} → {held:,} ({held // int(self.block_tokens or 1)} blocks of {self.block_tokens})"

    def to_dict(self) -> dict[str, Any]:
        """For the run's metadata: which model and values were used, and their sources."""
        out: dict[str, Any] = {"family": self.family}
        for k in ("pool_tokens", "slot_tokens", "slots", "block_tokens"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        out["sources"] = dict(self.sources)
        if self.note:
            out["note"] = self.note
        out["rule"] = RULES[self.family]
        if self.block_tokens and self.block_tokens > 1:
            out["rule"] += f" (C + max output rounded up to blocks of {self.block_tokens})"
        if self.measure_unknown_running:
            out["measure_unknown_running"] = True
            out["rule"] += (
                "; max running unknown: cells that fit only if fewer than N run at once are "
                "run, and judged over capacity when the server preempted requests"
            )
        return out


RULES = {
    "shared_pool": "over capacity when min(N, max running) × (C + max output) > KV pool",
    "per_slot": "over capacity when C + max output > the slot's cache; N above the slots queues",
    "unified_slots": "over capacity when min(N, slots) × (C + max output) > the unified pool; "
    "N above the slots queues",
    "tokens_in_flight": "over capacity when C + max output > the per-request token cap; "
    "N above the running cap queues",
    "unknown": "no capacity figure: no cell is over capacity",
}


def _cap(target: Any, name: str) -> tuple[int | None, str]:
    cap = getattr(target, "capacity", {}).get(name) if hasattr(target, "capacity") else None
    if cap is not None and getattr(cap, "value", None) is not None:
        src = cap.source + (f": {cap.detail}" if cap.detail else "")
        return int(cap.value), src
    value = getattr(target, name, None)
    return (int(value), "given") if value else (None, "missing")


def _llamacpp_model(
    kv: int | None,
    kv_src: str,
    ctx: int | None,
    ctx_src: str,
    run: int | None,
    run_src: str,
    layout: Any,
) -> CapacityModel:
    """llama.cpp's model: per slot, one unified pool of slots, or (layout unknown) the
    per-slot rule alone."""
    unified = layout.get("unified") if isinstance(layout, dict) else None
    how = str(layout.get("source", "")) if isinstance(layout, dict) else ""
    if kv is not None and kv_src.startswith("given") and ctx and run:
        # A pool given by the user settles the layout: smaller than the slots' caches
        # together means they share it.
        unified = kv < ctx * run
        how = f"given KV capacity {kv} vs {run} slots × {ctx}"
    if unified is False:
        return CapacityModel(
            "per_slot",
            slot_tokens=ctx,
            slots=run,
            sources={"slot_tokens": ctx_src, "slots": run_src, "layout": how},
        )
    if unified is True:
        # In unified mode a slot may use the whole pool, so the slot context is the
        # pool (capped at n_ctx_train: then a lower bound); a given pool wins.
        pool, pool_src = (kv, kv_src) if kv_src.startswith("given") else (ctx, ctx_src)
        return CapacityModel(
            "unified_slots",
            pool_tokens=pool,
            slots=run,
            sources={"pool_tokens": pool_src, "slots": run_src, "layout": how},
        )
    # Unknown layout: no pool is claimed (split slots hold slots × ctx, a unified pool
    # only ctx); the slot rule holds in both, and the server's refusal for lack of
    # context judges the pool (speedmatrix.verdict.refusal).
    return CapacityModel(
        "per_slot",
        slot_tokens=ctx,
        slots=run,
        sources={"slot_tokens": ctx_src, "slots": run_src, "layout": how or "unknown"},
        note="llama.cpp did not say whether its KV cache is unified: only the per-slot "
        "rule is applied, and a cell the server refuses for lack of context is over "
        "capacity in its words (give --launch-command or --kv-capacity for the pool)",
    )


def model_for(
    target: Any,
    *,
    kv_tokens: int | None = None,
    context_length: int | None = None,
    max_running: int | None = None,
) -> CapacityModel:
    """The capacity model of ``target`` (a Target, or anything with ``engine``,
    ``kv_tokens``, ``context_length``, ``max_running`` and optionally ``info``); keyword
    figures replace the target's (source ``given``)."""
    engine = str(getattr(target, "engine", None) or "generic")
    info = getattr(target, "info", None) or {}
    kv, kv_src = (kv_tokens, "given") if kv_tokens is not None else _cap(target, "kv_tokens")
    ctx, ctx_src = (
        (context_length, "given") if context_length is not None else _cap(target, "context_length")
    )
    run, run_src = (
        (max_running, "given") if max_running is not None else _cap(target, "max_running")
    )
    layout = info.get("kv_layout") if isinstance(info, dict) else None

    if engine == "llamacpp":
        return _llamacpp_model(kv, kv_src, ctx, ctx_src, run, run_src, layout)
    if engine in ("tgi", "ollama"):
        sources = {"slot_tokens": ctx_src, "slots": run_src}
        if kv is not None:  # TGI's max_batch_total_tokens where it is exposed
            sources["pool_tokens"] = kv_src
        return CapacityModel(
            "tokens_in_flight", pool_tokens=kv, slot_tokens=ctx, slots=run, sources=sources
        )
    if kv is None:
        return CapacityModel("unknown", slots=run, sources={"slots": run_src})
    block = info.get("kv_block_tokens") if isinstance(info, dict) else None
    block = int(block) if isinstance(block, int) and not isinstance(block, bool) else None
    metrics = getattr(target, "metrics", None)
    counts_preemptions = bool(
        metrics is not None
        and getattr(metrics, "available", False)
        and getattr(metrics, "preemptions", None)
    )
    sources = {"pool_tokens": kv_src, "slots": run_src}
    if block and block > 1:
        sources["block_tokens"] = str(info.get("kv_block_source") or "probed")
    return CapacityModel(
        "shared_pool",
        pool_tokens=kv,
        slots=run,
        sources=sources,
        block_tokens=block if block and block > 1 else None,
        # a load probe saw all its requests run at once: for N below that, N run
        measure_unknown_running=run is None
        and counts_preemptions
        and not info.get("max_running_at_least"),
    )
