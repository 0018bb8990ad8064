"""Ollama: ``/api/version``; ``/api/ps`` lists loaded models with their ``context_length``.
No metrics, no tokenize, no ignore_eos; prompts over the context are truncated silently,
so the runner must compare ``usage.prompt_tokens`` with what it sent."""

from __future__ import annotations

from typing import Any

from speedmatrix.adapters.base import Adapter, ProbeContext
from speedmatrix.adapters.helpers import positive_int
from speedmatrix.adapters.types import OutputControl


class OllamaAdapter(Adapter):
    name = "ollama"
    owned_by = ("ollama",)
    repository = "github.com/ollama/ollama"
    output = OutputControl(
        forced=False, note="Ollama has no ignore_eos/min_tokens: outputs may end early at EOS"
    )

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        version = ctx.get_dict("/api/version")
        if (version is None or "version" not in version) and not ctx.owned_by_matches(self):
            return None
        found: dict[str, Any] = {
            "warnings": [
                "Ollama has no metrics endpoint: queueing is judged from the client's view",
                "Ollama cannot be made to ignore end-of-sequence: output lengths are not forced",
                (
                    "Ollama truncates prompts longer than its context silently: prompt tokens are "
                    "checked against usage.prompt_tokens"
                ),
            ],
            "capacity_detail": {},
        }
        if version:
            found["version"] = version.get("version")
        ps = ctx.get_dict("/api/ps")
        lengths: dict[str, int] = {}
        for entry in (ps or {}).get("models") or []:
            if isinstance(entry, dict):
                n = positive_int(entry.get("context_length"))
                if n:
                    lengths[str(entry.get("name") or entry.get("model"))] = n
        if lengths:
            found["info"] = {"loaded_context_lengths": lengths}
            found["context_length"] = min(lengths.values())
            found["capacity_detail"]["context_length"] = "/api/ps context_length"
        else:
            found["warnings"].append(
                "Ollama reports a model's context length only while it is loaded (/api/ps): "
                "context length unknown (give --context-length)"
            )
        return found
