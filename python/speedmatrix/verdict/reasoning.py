"""Whether a server thought without streaming it: the ``reasoning_hidden`` flag's rule.

A reasoning model's server reports the thinking tokens in its usage
(``usage.completion_tokens_details.reasoning_tokens``). When it streams them
(``delta.reasoning_content`` / ``delta.reasoning``) the client times them; when it does
not, the thinking is silence before the first visible chunk, and TTFT and per-request
speed count it as waiting. This rule compares the two counts of a cell's requests.

Pure: it reads per-request counts, -1 where the server did not say.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["HIDDEN_SHARE_MIN", "reasoning_hidden"]

#: the share of the reported reasoning tokens that went unstreamed for the flag
HIDDEN_SHARE_MIN = 0.5


def reasoning_hidden(requests: Iterable[tuple[int, int]]) -> bool:
    """Whether the server hid its reasoning.

    ``requests``: per request ``(reported, streamed)``: the reasoning tokens the usage
    reported (-1 where it did not say) and the reasoning deltas the client received.
    True when the reported tokens sum above zero and more than `HIDDEN_SHARE_MIN` of
    them were never streamed; requests whose usage did not say are left out.
    """
    reported = streamed = 0
    for said, got in requests:
        if said < 0:
            continue
        reported += said
        streamed += min(max(got, 0), said)
    return reported > 0 and (reported - streamed) > HIDDEN_SHARE_MIN * reported
