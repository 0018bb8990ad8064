"""Hugging Face TGI: ``/info`` has per-request limits (``max_input_tokens``,
``max_total_tokens``) and the version; the batch token budget is not exposed by current
versions (older ones had ``max_batch_total_tokens``). The output length cannot be forced."""

from __future__ import annotations

from typing import Any

from speedmatrix.adapters.base import Adapter, ProbeContext
from speedmatrix.adapters.helpers import positive_int
from speedmatrix.adapters.types import MetricsSpec, OutputControl, TokenizeSpec


class TGIAdapter(Adapter):
    name = "tgi"
    owned_by = ("tgi", "text-generation-inference")
    repository = "github.com/huggingface/text-generation-inference"
    metrics = MetricsSpec(running="tgi_batch_current_size", waiting="tgi_queue_size", kv_usage=None)
    tokenize = (TokenizeSpec("/tokenize", "tgi"),)
    output = OutputControl(
        forced=False, note="TGI has no ignore_eos/min_tokens: outputs may end early at EOS"
    )

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        info = ctx.get_dict("/info")
        is_tgi = info is not None and ("max_total_tokens" in info or "max_input_tokens" in info)
        if not is_tgi and not ctx.owned_by_matches(self):
            return None
        found: dict[str, Any] = {"warnings": [], "capacity_detail": {}, "info": {}}
        if info is None or not is_tgi:
            found["warnings"].append("TGI's /info did not answer: limits unknown")
            return found
        found["version"] = info.get("version")
        found["commit"] = (info.get("sha") or None) and str(info["sha"])[:12]
        found["build"] = info.get("docker_label")
        found["context_length"] = positive_int(info.get("max_total_tokens"))
        found["capacity_detail"]["context_length"] = "/info max_total_tokens"
        budget = positive_int(info.get("max_batch_total_tokens"))
        if budget:
            found["kv_tokens"] = budget
            found["capacity_detail"]["kv_tokens"] = "/info max_batch_total_tokens"
        else:
            found["warnings"].append(
                "TGI does not expose its batch token budget: only its per-request cap "
                "max_total_tokens is checked (give --kv-capacity for the budget)"
            )
        batch = positive_int(info.get("max_batch_size"))
        if batch:
            found["max_running"] = batch
            found["capacity_detail"]["max_running"] = "/info max_batch_size"
        for key in ("max_input_tokens", "max_concurrent_requests", "model_id", "model_dtype"):
            if key in info:
                found["info"][key] = info[key]
        if info.get("model_id"):
            found["served_models"] = [str(info["model_id"])]
        found["warnings"].append(
            "TGI cannot be made to ignore end-of-sequence: output lengths are not forced"
        )
        return found
