"""The value types of the adapter interface: capacity figures, metric names, tokenize
endpoints, output control, and the keys a probe may return."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

CAPACITY_NAMES = ("kv_tokens", "context_length", "max_running")

#: ``stream_options`` values: usage in the final chunk / in every chunk
USAGE_FINAL: Mapping[str, Any] = MappingProxyType({"include_usage": True})
USAGE_CONTINUOUS: Mapping[str, Any] = MappingProxyType(
    {"include_usage": True, "continuous_usage_stats": True}
)
CAPACITY_SOURCES = ("probed", "given", "default", "missing")

#: Keys a probe may return. Capacity values are ints (or None = not known).
PROBE_KEYS = frozenset(
    {
        "version",
        "commit",
        "build",
        "backend",
        "quantization",
        "repository",
        "kv_tokens",
        "context_length",
        "max_running",
        "capacity_detail",  # {name: "where the value came from"}
        "metrics",  # MetricsSpec replacing the adapter's
        "tokenize",  # list[TokenizeSpec] candidates replacing the adapter's
        "token_id_prompts",
        "cache_reset",
        "served_models",  # names the engine says it serves, when /v1/models did not say
        "info",  # dict of further engine facts (page_size, dp_size, ...)
        "warnings",  # list[str]
    }
)


# ---- value types --------------------------------------------------------------------------
@dataclass
class Capacity:
    """One capacity figure and where it came from: ``probed`` from the server, ``given`` by
    the user (flag or argument), ``default`` (a built-in assumption) or ``missing``."""

    value: int | None
    source: str = "missing"
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "source": self.source}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class MetricsSpec:
    """Where the server's Prometheus text is and what its gauges are called.

    ``running``/``waiting`` are summed over all label sets (DP/TP ranks, engines, models);
    ``kv_usage`` (a 0..1 fraction) takes the maximum over label sets. ``url`` is a path
    relative to the target's base URL or a full URL; None = no metrics.
    """

    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None
    path: str | None = "/metrics"
    #: a counter of the requests the engine preempted (vLLM ``vllm:num_preemptions_total``):
    #: sampled during a cell, its increase flags the cell (None = not counted)
    preemptions: str | None = None
    #: set by discovery: whether the endpoint answered with Prometheus text
    available: bool = False

    def names(self) -> list[str]:
        return [n for n in (self.running, self.waiting, self.kv_usage) if n]

    #: how each gauge is reduced over its label sets (DP/TP ranks): request counts add
    #: up; KV usage is a fraction of each rank's own pool and the fullest rank is the
    #: one that limits admission. The one rule for one-off reads (`reduce`) and the
    #: sampler during a cell (`reductions`, CellSpec.metric_reduce).
    REDUCE: ClassVar[Mapping[str, str]] = MappingProxyType(
        {"running": "sum", "waiting": "sum", "kv_usage": "max"}
    )

    def reductions(self, names: list[str]) -> list[str]:
        """``"sum"``/``"max"`` for each of ``names`` (gauge names of this spec)."""
        by_name = {getattr(self, role): how for role, how in self.REDUCE.items()}
        if self.preemptions:  # a counter per engine (DP rank): the ranks' counts add up
            by_name[self.preemptions] = "sum"
        return [by_name.get(n, "sum") for n in names]

    def reduce(self, samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float | None]:
        """``{"running", "waiting", "kv_usage"}`` from parsed samples (None = not exposed)."""
        out: dict[str, float | None] = {}
        for role, how in self.REDUCE.items():
            name = getattr(self, role)
            values = [v for n, _labels, v in samples if name and n == name]
            out[role] = (sum(values) if how == "sum" else max(values)) if values else None
        return out


@dataclass(frozen=True)
class TokenizeSpec:
    """How to ask the server how many tokens a text (or a chat) is.

    ``style``:
      - ``openai``   (vLLM, SGLang, the sim): ``{model, prompt}`` or ``{model, messages}`` →
        ``{tokens, count}``
      - ``llamacpp``: ``{content, add_special: true}`` → ``{tokens}``
      - ``tgi``:      ``{inputs}`` → ``[{id, text, start, stop}]``
      - ``lmdeploy``: ``{input}`` → ``{input_ids, length}``

    ``template``: a POST path that renders chat messages with the server's own template
    (llama.cpp ``/apply-template`` ``{messages}`` → ``{prompt}``); chats are then counted
    as that text, the way the chat endpoint tokenizes it. Use :meth:`count`.
    """

    path: str
    style: str = "openai"
    messages: bool = False
    template: str | None = None

    def count(
        self, client: Any, model: str | None, text: str | None = None, messages: list | None = None
    ) -> tuple[int, list[int] | None]:
        """(token count, ids or None) of a text or a chat, asked of the server."""
        if messages is not None and self.template:
            if not self.messages:
                raise ValueError(f"{self.path} ({self.style}) cannot tokenize chat messages")
            rendered = client.post_json(self.template, {"messages": messages})
            prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
            if not isinstance(prompt, str):
                raise ValueError(f"{self.template} answered without a prompt")
            body = self.request(model, prompt)
            if self.style == "llamacpp":
                body["parse_special"] = True  # the chat endpoint parses special tokens
            return self.parse(client.post_json(self.path, body))
        return self.parse(client.post_json(self.path, self.request(model, text, messages)))

    def request(
        self, model: str | None, text: str | None = None, messages: list | None = None
    ) -> dict[str, Any]:
        if messages is not None:
            if not self.messages:
                raise ValueError(f"{self.path} ({self.style}) cannot tokenize chat messages")
            body: dict[str, Any] = {"messages": messages, "add_generation_prompt": True}
            if model:
                body["model"] = model
            return body
        if self.style == "openai":
            body = {"prompt": text}
            if model:
                body["model"] = model
            return body
        if self.style == "llamacpp":
            # add_special: count the BOS the completion endpoint adds too
            return {"content": text, "add_special": True}
        if self.style == "tgi":
            return {"inputs": text}
        if self.style == "lmdeploy":
            return {"input": text}
        raise ValueError(f"unknown tokenize style {self.style!r}")

    def ids(self, client: Any, model: str | None, text: str) -> list[int]:
        """Token ids of a plain ``text`` with no special tokens added (an answer's text, as
        it continues a prompt); ValueError when the endpoint gives no ids."""
        body = self.request(model, text)
        if self.style == "llamacpp":
            body["add_special"] = False
        elif self.style == "openai":
            body["add_special_tokens"] = False
        ids = self.parse(client.post_json(self.path, body))[1]
        if ids is None:
            raise ValueError(f"{self.path} answered a count without token ids")
        return ids

    def parse(self, answer: Any) -> tuple[int, list[int] | None]:
        """(token count, token ids or None) from the endpoint's JSON answer."""
        if self.style == "tgi" and isinstance(answer, list):
            return len(answer), [int(t["id"]) for t in answer if isinstance(t, dict) and "id" in t]
        if isinstance(answer, dict):
            ids = answer.get("tokens", answer.get("input_ids"))
            if isinstance(ids, list) and ids and isinstance(ids[0], dict):
                # a server's answer may mix shapes: anything not {"id": int} is not a token
                ids = [t.get("id") if isinstance(t, dict) else None for t in ids]
            ids = [int(t) for t in ids] if isinstance(ids, list) else None
            count = answer.get("count", answer.get("length"))
            if isinstance(count, int):
                return count, ids
            if ids is not None:
                return len(ids), ids
        raise ValueError(f"tokenize answer has no token count: {str(answer)[:120]}")


@dataclass
class OutputControl:
    """How to make the server produce exactly ``max_tokens`` output tokens.

    ``forced`` is False where the engine offers no way (TGI, Ollama): outputs may end early at
    an end-of-sequence token and the runner must say the output length was not forced.
    """

    forced: bool = False
    ignore_eos: bool = False
    min_tokens_field: str | None = None
    #: extra names the max output goes under for chat requests (besides ``max_tokens``)
    chat_max_fields: tuple[str, ...] = ()
    note: str = ""

    def fields(self, api: str, max_tokens: int) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": int(max_tokens)}
        if api == "chat":
            for name in self.chat_max_fields:
                out[name] = int(max_tokens)
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.min_tokens_field:
            out[self.min_tokens_field] = int(max_tokens)
        return out


#: engines that take ``ignore_eos`` and ``min_tokens`` (vLLM, SGLang, TensorRT-LLM): output
#: lengths are forced to ``max_tokens``
FORCED_BY_MIN_TOKENS = OutputControl(forced=True, ignore_eos=True, min_tokens_field="min_tokens")
