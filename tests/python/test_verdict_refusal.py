"""A server's refusal for lack of context or KV is the over-capacity verdict, with the
server's words (speedmatrix.verdict.refusal), on the messages real servers send."""

from __future__ import annotations

import pytest
from speedmatrix.verdict import Status, context_refusal, refused_for_capacity

LLAMACPP_400 = (
    '{"error":{"code":400,"message":"request (6200 tokens) exceeds the available context '
    'size (6144 tokens), try increasing it","type":"exceed_context_size_error"}}'
)
LLAMACPP_500 = (
    '{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}'
)

# (message, a refusal for lack of context/KV?)
MESSAGES = [
    (LLAMACPP_400, True),
    (LLAMACPP_500, True),
    ("failed to find free space in the KV cache", True),
    (
        (
            "This model's maximum context length is 4096 tokens. However, you requested "
            "5000 tokens (4872 in the messages, 128 in the completion)."
        ),
        True,
    ),
    ("The prompt (is 5000 tokens) is longer than the maximum model length of 4096.", True),
    ("The input (5000 tokens) is longer than the model's context length (4096 tokens).", True),
    ("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096.", True),
    ("Input validation error: `inputs` must have less than 4000 tokens. Given: 5000", True),
    ('{"error":{"code":500,"message":"internal error","type":"server_error"}}', False),
    ("connection reset by peer", False),
    ("HTTP 503: Service Unavailable", False),
    ("", False),
    (None, False),
]


@pytest.mark.parametrize(("message", "refusal"), MESSAGES)
def test_context_refusal(message, refusal):
    assert context_refusal(message) is refusal


# (status in, reason in, error examples, status out, words in the reason out)
VERDICTS = [
    # refused for lack of context: over capacity, with the server's words
    (
        Status.ERROR,
        "2 of 4 requests failed",
        {"http_500": LLAMACPP_500},
        Status.OVER_CAPACITY,
        "Context size has been exceeded",
    ),
    (
        Status.ERROR,
        "warm-up failed",
        {"connect": "reset", "http_400": LLAMACPP_400},
        Status.OVER_CAPACITY,
        "exceeds the available context size (6144 tokens)",
    ),
    # other failures stay errors
    (
        Status.ERROR,
        "2 of 4 requests failed",
        {"http_500": "internal error"},
        Status.ERROR,
        "2 of 4 requests failed",
    ),
    (Status.ERROR, "no output tokens in the window", {}, Status.ERROR, "no output tokens"),
    # a cell whose few refusals stayed under the error threshold keeps its verdict
    (Status.VALID, None, {"http_500": LLAMACPP_500}, Status.VALID, None),
    (Status.QUEUED, "waited", {"http_500": LLAMACPP_500}, Status.QUEUED, "waited"),
]


@pytest.mark.parametrize(("status", "reason", "examples", "want", "words"), VERDICTS)
def test_refused_for_capacity(status, reason, examples, want, words):
    got, why = refused_for_capacity(status, reason, examples)
    assert got == want
    if words is None:
        assert why is None
    else:
        assert words in why
