"""LMDeploy ``api_server``: recognised by ``owned_by`` or its metric names; tokenize is
``/v1/encode``; no capacity endpoint."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from speedmatrix.adapters.base import Adapter, ProbeContext
from speedmatrix.adapters.types import MetricsSpec, OutputControl, TokenizeSpec


class LMDeployAdapter(Adapter):
    name = "lmdeploy"
    owned_by = ("lmdeploy",)
    repository = "github.com/InternLM/lmdeploy"
    metrics = MetricsSpec(
        running="lmdeploy:num_requests_running",
        waiting="lmdeploy:num_requests_waiting",
        kv_usage="lmdeploy:gpu_cache_usage_perc",
    )
    tokenize = (TokenizeSpec("/v1/encode", "lmdeploy"),)
    output = OutputControl(
        forced=True,
        ignore_eos=True,
        min_tokens_field="min_new_tokens",
        chat_max_fields=("max_completion_tokens",),
    )

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        samples, has_metrics = ctx.metrics_named("lmdeploy:")
        if not has_metrics and not ctx.owned_by_matches(self):
            return None
        found = ctx.found(
            "LMDeploy exposes no KV capacity: over-capacity cells cannot be predicted "
            "(give --kv-capacity)"
        )
        if samples is None:
            found["metrics"] = replace(self.metrics, path=None)
        return found
