"""vLLM (V1): ``/version``; the KV pool is the ``vllm:cache_config_info`` gauge's labels
(``num_gpu_blocks`` × ``block_size``, per ``engine``; a request holds whole blocks);
``max_model_len`` in /v1/models. Metrics are always on. vLLM does not publish
``max_num_seqs``: it comes from ``--max-running``, the launch command or a load probe
(`speedmatrix.adapters.running`); else the capacity rule leaves the cells that depend on it
to the measurement (preemptions, ``vllm:num_preemptions_total``)."""

from __future__ import annotations

from typing import Any

from speedmatrix.adapters.base import (
    USAGE_CONTINUOUS,
    Adapter,
    MetricsSpec,
    OutputControl,
    ProbeContext,
    TokenizeSpec,
    first_metric,
    positive_int,
    split_version,
)
from speedmatrix.adapters.sglang import kv_from_server_info, server_info


def kv_from_cache_config(samples: list[tuple[str, dict[str, str], float]]) -> int | None:
    """Sum over engines (data-parallel ranks) of num_gpu_blocks × block_size."""
    per_engine: dict[str, int] = {}
    for name, labels, _value in samples:
        if name != "vllm:cache_config_info":
            continue
        blocks = positive_int(labels.get("num_gpu_blocks"))
        size = positive_int(labels.get("block_size"))
        if blocks and size:
            per_engine[labels.get("engine", "0")] = blocks * size
    return sum(per_engine.values()) if per_engine else None


def block_size_from_cache_config(samples: list[tuple[str, dict[str, str], float]]) -> int | None:
    """Tokens per KV block (``block_size``): vLLM gives each request whole blocks."""
    for name, labels, _value in samples:
        if name == "vllm:cache_config_info":
            size = positive_int(labels.get("block_size"))
            if size:
                return size
    return None


#: the preemption counter's names: V1 exposes the counter vllm:num_preemptions as
#: ..._total; older servers had the bare name
PREEMPTION_COUNTERS = ("vllm:num_preemptions_total", "vllm:num_preemptions")


class VLLMAdapter(Adapter):
    name = "vllm"
    owned_by = ("vllm",)
    repository = "github.com/vllm-project/vllm"
    metrics = MetricsSpec(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        path="/metrics",
    )
    tokenize = (TokenizeSpec("/tokenize", "openai", messages=True),)
    output = OutputControl(forced=True, ignore_eos=True, min_tokens_field="min_tokens")
    token_id_prompts = True
    stream_options = USAGE_CONTINUOUS
    # only with VLLM_SERVER_DEV_MODE=1; a 404 there means "not available"
    cache_reset = "/reset_prefix_cache"
    # 0.10.2 on: each chunk's choice carries its "token_ids" (CompletionResponseStreamChoice)
    answer_ids_field = "return_token_ids"

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        samples, has_vllm_metrics = ctx.metrics_named("vllm:")
        if not has_vllm_metrics and not ctx.owned_by_matches(self):
            return None
        found = ctx.found()
        # named even when /v1/models gives no length, as this adapter always did
        found["capacity_detail"]["context_length"] = "/v1/models max_model_len"
        version = ctx.get_dict("/version")
        if version:
            found["version"], found["commit"] = split_version(version.get("version"))
        kv = kv_from_cache_config(samples or [])
        if kv:
            found["kv_tokens"] = kv
            found["capacity_detail"]["kv_tokens"] = (
                "vllm:cache_config_info num_gpu_blocks × block_size"
            )
            block = block_size_from_cache_config(samples or [])
            found["info"] = {
                "kv_block_tokens": block,
                "kv_block_source": "probed: vllm:cache_config_info block_size",
            }
        else:
            # vLLM-compatible servers (the built-in engine's vllm flavour) may offer it here
            path, info = server_info(ctx)
            if info is not None:
                found["kv_tokens"], detail = kv_from_server_info(info)
                found["capacity_detail"]["kv_tokens"] = f"{path} {detail}"
                found["max_running"] = positive_int(info.get("max_running_requests"))
                found["capacity_detail"]["max_running"] = f"{path} max_running_requests"
            else:
                found["warnings"].append(
                    "vLLM's vllm:cache_config_info gauge is missing: KV capacity unknown "
                    "(give --kv-capacity)"
                )
        if samples is not None:
            found["metrics"] = MetricsSpec(
                running="vllm:num_requests_running",
                waiting="vllm:num_requests_waiting",
                kv_usage=first_metric(
                    samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
                )
                or "vllm:kv_cache_usage_perc",
                path="/metrics",
                preemptions=first_metric(samples, *PREEMPTION_COUNTERS),
            )
        return found
