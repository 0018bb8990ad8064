"""TensorRT-LLM ``trtllm-serve``: ``/version``; ``/metrics`` is JSON iteration statistics
(``kvCacheStats``, ``maxNumActiveRequests``; empty until a request ran), Prometheus text at
``/prometheus/metrics`` when enabled. It rejects unknown request fields, so only fields it
knows are sent."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from speedmatrix.adapters.base import Adapter, ProbeContext
from speedmatrix.adapters.helpers import positive_int, split_version
from speedmatrix.adapters.types import (
    FORCED_BY_MIN_TOKENS,
    USAGE_CONTINUOUS,
    MetricsSpec,
)

PROM_PATH = "/prometheus/metrics"


class TRTLLMAdapter(Adapter):
    name = "trtllm"
    owned_by = ("tensorrt_llm", "trtllm")
    repository = "github.com/NVIDIA/TensorRT-LLM"
    metrics = MetricsSpec(
        running="trtllm_num_requests_running",
        waiting="trtllm_num_requests_waiting",
        kv_usage="trtllm_kv_cache_utilization",
        path=PROM_PATH,
    )
    output = FORCED_BY_MIN_TOKENS
    token_id_prompts = True
    stream_options = USAGE_CONTINUOUS

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        samples, has_prom = ctx.metrics_named("trtllm_", PROM_PATH)
        if not has_prom and not ctx.owned_by_matches(self):
            return None
        found = ctx.found()
        version = ctx.get_dict("/version")
        if version:
            found["version"], found["commit"] = split_version(version.get("version"))
        values = {n: v for n, _l, v in samples or []}
        blocks = positive_int(values.get("trtllm_kv_cache_max_blocks"))
        per_block = positive_int(values.get("trtllm_kv_cache_tokens_per_block"))
        if blocks and per_block:
            found["kv_tokens"] = blocks * per_block
            found["capacity_detail"]["kv_tokens"] = f"{PROM_PATH} max_blocks × tokens_per_block"
        stats = ctx.get_json("/metrics")
        if isinstance(stats, list) and stats and isinstance(stats[-1], dict):
            last = stats[-1]
            kv = last.get("kvCacheStats") or {}
            blocks = positive_int(kv.get("maxNumBlocks"))
            per_block = positive_int(kv.get("tokensPerBlock"))
            if blocks and per_block and "kv_tokens" not in found:
                found["kv_tokens"] = blocks * per_block
                found["capacity_detail"]["kv_tokens"] = "/metrics kvCacheStats"
            if positive_int(last.get("maxNumActiveRequests")):
                found["max_running"] = positive_int(last.get("maxNumActiveRequests"))
                found["capacity_detail"]["max_running"] = "/metrics maxNumActiveRequests"
        if "kv_tokens" not in found:
            found["warnings"].append(
                "TensorRT-LLM exposed no KV statistics: KV capacity unknown (give --kv-capacity)"
            )
        found["metrics"] = replace(self.metrics, path=PROM_PATH if samples is not None else None)
        return found
