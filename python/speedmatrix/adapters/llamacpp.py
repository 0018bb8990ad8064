"""llama.cpp ``llama-server``: ``/props`` gives the per-slot context (``n_ctx``), the number
of slots and the build; the KV cache is split among the slots, so its capacity is
n_ctx × total_slots. Metrics need ``--metrics`` and carry no labels."""

from __future__ import annotations

import re
from typing import Any

from speedmatrix.adapters.base import (
    USAGE_FINAL,
    Adapter,
    MetricsSpec,
    OutputControl,
    ProbeContext,
    TokenizeSpec,
    first_metric,
    positive_int,
)

_BUILD = re.compile(r"^b?(\d+)-([0-9a-f]{6,40})$")


class LlamaCppAdapter(Adapter):
    name = "llamacpp"
    owned_by = ("llamacpp", "llama.cpp")
    repository = "github.com/ggml-org/llama.cpp"
    metrics = MetricsSpec(
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        kv_usage=None,
        path="/metrics",
    )
    tokenize = (TokenizeSpec("/tokenize", "llamacpp"),)
    output = OutputControl(
        forced=True, ignore_eos=True, note="no min_tokens: ignore_eos runs to max_tokens"
    )
    token_id_prompts = True
    stream_options = USAGE_FINAL
    cache_reset = None

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
        if n_ctx and slots:
            found["kv_tokens"] = n_ctx * slots
            found["capacity_detail"]["kv_tokens"] = "/props n_ctx × total_slots"
        build = props.get("build_info")
        if isinstance(build, str) and build:
            match = _BUILD.match(build.strip())
            found["version"] = f"b{match.group(1)}" if match else build
            found["commit"] = match.group(2) if match else None
            found["build"] = build
        if props.get("model_path"):
            found["info"]["model_path"] = props["model_path"]
            found["served_models"] = [str(props["model_path"]).rsplit("/", 1)[-1]]
        samples = ctx.get_metrics("/metrics")
        if samples is not None:
            found["metrics"] = MetricsSpec(
                running="llamacpp:requests_processing",
                waiting="llamacpp:requests_deferred",
                kv_usage=first_metric(samples, "llamacpp:kv_cache_usage_ratio"),
                path="/metrics",
            )
        return found
