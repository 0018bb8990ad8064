"""SGLang: ``/server_info`` (new) or ``/get_server_info`` (old) carry the server arguments and
the scheduler's ``max_total_num_tokens`` (the KV pool in tokens); per-DP-rank values sit in
``internal_states``. Metrics need ``--enable-metrics``; gauges carry ``tp_rank``/``dp_rank``
labels and are summed over ranks."""

from __future__ import annotations

from typing import Any

from speedmatrix.adapters.base import Adapter, ProbeContext
from speedmatrix.adapters.helpers import positive_int, split_version
from speedmatrix.adapters.types import (
    FORCED_BY_MIN_TOKENS,
    USAGE_CONTINUOUS,
    MetricsSpec,
    TokenizeSpec,
)
from speedmatrix.naming import precision_label

INFO_PATHS = ("/server_info", "/get_server_info")
_INFO_KEYS = ("max_total_num_tokens", "internal_states", "served_model_name", "tp_size")


def server_info(ctx: ProbeContext) -> tuple[str | None, dict[str, Any] | None]:
    """(path, answer) of SGLang's server-info endpoint, (None, None) when neither answers."""
    for path in INFO_PATHS:
        info = ctx.get_dict(path)
        if info is not None and any(k in info for k in _INFO_KEYS):
            return path, info
    return None, None


def kv_from_server_info(info: dict[str, Any]) -> tuple[int | None, str]:
    """KV pool tokens. With data parallelism each DP rank has its own pool and
    ``internal_states`` one entry per rank: the pools add up."""
    states = [s for s in info.get("internal_states") or [] if isinstance(s, dict)]
    per_rank = [v for v in (positive_int(s.get("max_total_num_tokens")) for s in states) if v]
    dp = positive_int(info.get("dp_size")) or 1
    if dp > 1 and len(per_rank) > 1:
        return sum(per_rank), f"sum of max_total_num_tokens over {len(per_rank)} DP ranks"
    top = positive_int(info.get("max_total_num_tokens"))
    if top:
        return top, "max_total_num_tokens"
    if per_rank:
        return sum(per_rank), "internal_states[].max_total_num_tokens"
    return None, ""


def max_running_from_server_info(info: dict[str, Any]) -> int | None:
    top = positive_int(info.get("max_running_requests"))
    if top:
        return top
    states = [s for s in info.get("internal_states") or [] if isinstance(s, dict)]
    values = [v for v in (positive_int(s.get("max_running_requests")) for s in states) if v]
    return sum(values) if values else None


class SGLangAdapter(Adapter):
    name = "sglang"
    owned_by = ("sglang",)
    repository = "github.com/sgl-project/sglang"
    metrics = MetricsSpec(
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage",
    )
    tokenize = (
        TokenizeSpec("/v1/tokenize", "openai", messages=True),
        TokenizeSpec("/tokenize", "openai", messages=True),
    )
    output = FORCED_BY_MIN_TOKENS
    token_id_prompts = True
    stream_options = USAGE_CONTINUOUS
    cache_reset = "/flush_cache"

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        path, info = server_info(ctx)
        if info is None and not ctx.owned_by_matches(self):
            return None
        found: dict[str, Any] = {"warnings": [], "capacity_detail": {}}
        if info is None:
            found["warnings"].append(
                "SGLang's /server_info and /get_server_info did not answer: KV capacity and the "
                "running cap are unknown (give --kv-capacity / --max-running)"
            )
            found["context_length"] = ctx.max_model_len()
            model_info = ctx.get_dict("/get_model_info")
            if model_info and model_info.get("model_path"):
                found["info"] = {"model_path": model_info["model_path"]}
            return found
        found["version"], found["commit"] = split_version(info.get("version"))
        kv, detail = kv_from_server_info(info)
        found["kv_tokens"] = kv
        found["capacity_detail"]["kv_tokens"] = f"{path} {detail}".strip()
        context = ctx.max_model_len() or positive_int(info.get("context_length"))
        found["context_length"] = context
        found["capacity_detail"]["context_length"] = (
            "/v1/models max_model_len" if ctx.max_model_len() else f"{path} context_length"
        )
        found["max_running"] = max_running_from_server_info(info)
        found["capacity_detail"]["max_running"] = f"{path} max_running_requests"
        # The seed's "Quantization: BF16" is the weights' precision: without a quantization
        # method the dtype says it (unless it is "auto", which names nothing).
        quant = info.get("quantization")
        found["quantization"] = str(quant) if quant else precision_label(info.get("dtype"))
        served = info.get("served_model_name")
        if isinstance(served, str) and served:
            found["served_models"] = [served]
        found["info"] = {
            k: info[k]
            for k in (
                "tp_size",
                "dp_size",
                "pp_size",
                "page_size",
                "dtype",
                "kv_cache_dtype",
                "max_req_input_len",
                "chunked_prefill_size",
                "disable_radix_cache",
                "model_path",
                "attention_backend",
                "mem_fraction_static",
            )
            if k in info
        }
        page = positive_int(info.get("page_size"))
        if page and page > 1:  # the token pool is allocated in pages of this many tokens
            found["info"]["kv_block_tokens"] = page
            found["info"]["kv_block_source"] = f"probed: {path} page_size"
        if "model_path" not in found["info"]:  # older servers: /get_model_info has it
            model_info = ctx.get_dict("/get_model_info")
            if model_info and model_info.get("model_path"):
                found["info"]["model_path"] = model_info["model_path"]
        if info.get("disable_radix_cache"):
            found["cache_reset"] = None
        return found
