"""llama.cpp ``llama-server``: ``/props`` gives the per-slot context
(``default_generation_settings.n_ctx``), the number of slots (``total_slots``), the model's
file type (``model_ftype``), its path and the build; ``/v1/models`` ``meta`` the trained
context (``n_ctx_train``). Metrics need ``--metrics`` and carry no labels.

KV layout (capacity.py): with split slot caches each of the K slots holds n_ctx / K tokens;
with a unified cache (``--kv-unified``, and this llama.cpp's default launch) the K slots
share one pool and each may use all of it. ``/props`` n_ctx is the slot's context in both,
and neither ``/props``, ``/slots`` nor ``/v1/models`` says which layout it is (only the
server's log does), so with more than one slot the layout is unknown: no pool is claimed
(a coincidence of n_ctx and n_ctx_train settles nothing: ``-np 2 -c 12288 --kv-unified``
on a 16K model looks like split slots), only the slot rule is applied, and a request the
server refuses for lack of context is the cell's over-capacity verdict
(speedmatrix.verdict.refusal). A launch command that says it settles it (`layout_from_launch`), and so does a given
``--kv-capacity`` (capacity.model_for).
Slot caches are emptied with ``POST /slots/{id}?action=erase``."""

from __future__ import annotations

import re
import shlex
from typing import Any

from speedmatrix.adapters.base import Adapter, ProbeContext
from speedmatrix.adapters.helpers import first_metric, positive_int
from speedmatrix.adapters.types import USAGE_FINAL, MetricsSpec, OutputControl, TokenizeSpec
from speedmatrix.naming import served_model_name

_BUILD = re.compile(r"^b?(\d+)-([0-9a-f]{6,40}|unknown)$")


def kv_layout(
    n_ctx: int | None, slots: int | None, props: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``{"unified": True | False | None, "source": why}``: what the server says about its
    KV layout; None (unknown) where it says nothing."""
    if not n_ctx or not slots:
        return {"unified": None, "source": "/props lacks n_ctx or total_slots"}
    if slots == 1:
        return {"unified": False, "source": "one slot: its cache is the whole pool"}
    # a build that states it (none known today reports it in /props)
    stated = (props or {}).get("kv_unified")
    if isinstance(stated, bool):
        return {"unified": stated, "source": "/props kv_unified"}
    return {
        "unified": None,
        "source": f"/props does not say whether the {slots} slots of {n_ctx} tokens share "
        "one KV cache (unified) or each have their own (split)",
    }


def layout_from_launch(command: str | None) -> dict[str, Any] | None:
    """The KV layout a llama-server launch command sets, or None when it does not say:
    ``-kvu``/``--kv-unified`` unified, ``-no-kvu``/``--no-kv-unified`` split, an explicit
    ``-np``/``--parallel`` K > 1 without either split (unified is the default only when
    the slot count is auto)."""
    if not command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    names = [w.partition("=")[0] for w in words]
    for flag in reversed(names):  # the last one wins
        if flag in ("-kvu", "--kv-unified"):
            return {"unified": True, "source": f"given: launch command {flag}"}
        if flag in ("-no-kvu", "--no-kv-unified"):
            return {"unified": False, "source": f"given: launch command {flag}"}
    for i, flag in enumerate(names):
        if flag in ("-np", "--parallel"):
            value = words[i].partition("=")[2] or (words[i + 1] if i + 1 < len(words) else "")
            if value.isdigit() and int(value) > 1:
                return {
                    "unified": False,
                    "source": f"given: launch command {flag} {value} without --kv-unified",
                }
    return None


#: discovery's warning when /props leaves the layout open; `learn_layout` withdraws it once a
#: launch command settles the layout
LAYOUT_UNKNOWN = (
    "llama.cpp does not say whether its KV cache is unified: only the per-slot "
    "rule is applied, and a request refused for lack of context makes its cell "
    "over capacity (give --launch-command or --kv-capacity to settle the pool)"
)


class LlamaCppAdapter(Adapter):
    name = "llamacpp"
    owned_by = ("llamacpp", "llama.cpp")
    repository = "github.com/ggml-org/llama.cpp"
    metrics = MetricsSpec(
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        kv_usage=None,
    )
    # chats: rendered by the server's own template (/apply-template), then tokenized as the
    # chat endpoint does, so chat prompts are exact too
    tokenize = (TokenizeSpec("/tokenize", "llamacpp", messages=True, template="/apply-template"),)
    output = OutputControl(
        forced=True, ignore_eos=True, note="no min_tokens: ignore_eos runs to max_tokens"
    )
    token_id_prompts = True
    stream_options = USAGE_FINAL
    #: every slot's cache; {id} is replaced by each slot id (0 .. total_slots - 1)
    cache_reset = "/slots/{id}?action=erase"

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        props = ctx.get_dict("/props")
        is_llamacpp = props is not None and (
            "default_generation_settings" in props or "total_slots" in props
        )
        if not is_llamacpp and not ctx.owned_by_matches(self):
            return None
        found: dict[str, Any] = {"warnings": [], "capacity_detail": {}, "info": {}}
        if props is None or not is_llamacpp:
            found["warnings"].append("llama.cpp's /props did not answer: capacity unknown")
            return found
        settings = props.get("default_generation_settings") or {}
        n_ctx = positive_int(settings.get("n_ctx")) or positive_int(props.get("n_ctx"))
        slots = positive_int(props.get("total_slots"))
        found["context_length"] = n_ctx
        found["capacity_detail"]["context_length"] = "/props default_generation_settings.n_ctx"
        found["max_running"] = slots
        found["capacity_detail"]["max_running"] = "/props total_slots"
        meta = _model_meta(ctx)
        n_ctx_train = positive_int(meta.get("n_ctx_train"))
        if n_ctx_train:
            found["info"]["n_ctx_train"] = n_ctx_train
        layout = kv_layout(n_ctx, slots, props)
        found["info"]["kv_layout"] = layout
        if layout["unified"] is True:
            found["kv_tokens"] = n_ctx
            found["capacity_detail"]["kv_tokens"] = "/props n_ctx: the unified pool"
        elif layout["unified"] is False and n_ctx and slots:
            found["kv_tokens"] = n_ctx * slots
            found["capacity_detail"]["kv_tokens"] = "/props n_ctx × total_slots: split slot caches"
        else:
            found["warnings"].append(LAYOUT_UNKNOWN)
        ftype = props.get("model_ftype") or meta.get("ftype")
        if isinstance(ftype, str) and ftype:
            found["quantization"] = ftype
        build = props.get("build_info")
        if isinstance(build, str) and build:
            match = _BUILD.match(build.strip())
            found["version"] = f"b{match.group(1)}" if match else build
            commit = match.group(2) if match else None
            found["commit"] = None if commit == "unknown" else commit
            found["build"] = build
        if props.get("model_path"):
            found["info"]["model_path"] = props["model_path"]
            found["served_models"] = [served_model_name(props["model_path"])]
        samples = ctx.get_metrics("/metrics")
        if samples is not None:
            found["metrics"] = MetricsSpec(
                running="llamacpp:requests_processing",
                waiting="llamacpp:requests_deferred",
                kv_usage=first_metric(samples, "llamacpp:kv_cache_usage_ratio"),
            )
        return found


def _model_meta(ctx: ProbeContext) -> dict[str, Any]:
    """``meta`` of the first model in /v1/models (llama.cpp: n_ctx_train, ftype, n_params)."""
    for entry in ctx.models:
        if isinstance(entry, dict) and isinstance(entry.get("meta"), dict):
            return entry["meta"]
    return {}
