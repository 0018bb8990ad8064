"""A server's refusal for lack of context or KV cache is the over-capacity verdict.

A cell the capacity model let through (its layout unknown, or a figure the server does not
publish) may still not fit: the server then refuses requests for lack of context or KV.
That refusal is the server saying the cell is over its capacity, not a failure of the
run: the cell is ``over_capacity``, with the server's own words as the reason.

Pure: it reads the error messages a cell's failed requests carried.
"""

from __future__ import annotations

import re

from speedmatrix.verdict.names import Status

__all__ = ["CONTEXT_REFUSALS", "context_refusal", "refused_for_capacity"]

#: what servers answer when a request does not fit their context or KV cache, per family
_REFUSAL_WORDS = (
    # llama.cpp: a prompt beyond the slot (HTTP 400), or a unified pool full (500)
    r"exceed_context_size_error",
    r"context size has been exceeded",
    r"exceeds the available context size",
    r"failed to find (a )?(free space|memory slot) in the kv cache",
    # vLLM and SGLang (their OpenAI servers word it alike)
    r"maximum context length",
    r"longer than the maximum model length",
    r"longer than the model'?s context length",
    # TGI: input validation of inputs + max_new_tokens
    r"must be <= \d+",
    r"must have less than \d+ tokens",
)
CONTEXT_REFUSALS = re.compile("|".join(_REFUSAL_WORDS), re.IGNORECASE)


def context_refusal(message: str | None) -> bool:
    """Whether a failed request's message is a refusal for lack of context or KV."""
    return bool(message) and CONTEXT_REFUSALS.search(str(message)) is not None


def refused_for_capacity(
    status: Status, reason: str | None, error_examples: dict[str, str]
) -> tuple[Status, str | None]:
    """An ``error`` verdict whose failures include a refusal for lack of context or KV
    becomes ``over_capacity`` with the server's words; any other verdict is kept."""
    if status != Status.ERROR:
        return status, reason
    words = [m for _, m in sorted(error_examples.items()) if context_refusal(m)]
    if not words:
        return status, reason
    return Status.OVER_CAPACITY, f"the server refused it for lack of context/KV: {words[0]}"
