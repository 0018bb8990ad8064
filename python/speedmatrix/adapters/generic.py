"""Any other OpenAI-compatible server: /v1/models and whatever well-known endpoints answer.
Always matches; tried last."""

from __future__ import annotations

from typing import Any

from speedmatrix.adapters.base import Adapter, ProbeContext
from speedmatrix.adapters.helpers import first_metric
from speedmatrix.adapters.types import MetricsSpec, OutputControl, TokenizeSpec

# (running, waiting, kv_usage) name sets of engines whose metric names other servers reuse
_KNOWN_METRICS = (
    ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
)


class GenericAdapter(Adapter):
    name = "generic"
    owned_by = ()
    tokenize = (
        TokenizeSpec("/tokenize", "openai", messages=True),
        TokenizeSpec("/v1/tokenize", "openai", messages=True),
    )
    output = OutputControl(
        forced=False, note="unknown engine: only max_tokens is sent (add fields with extra)"
    )

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        found = ctx.found(
            "engine not recognised: treated as a generic OpenAI-compatible server "
            "(KV capacity unknown unless given; output length not forced)"
        )
        samples = ctx.get_metrics("/metrics")
        if samples:
            for running, waiting, kv in _KNOWN_METRICS:
                if first_metric(samples, running):
                    found["metrics"] = MetricsSpec(
                        running=running,
                        waiting=first_metric(samples, waiting),
                        kv_usage=first_metric(samples, kv),
                    )
                    break
        return found
