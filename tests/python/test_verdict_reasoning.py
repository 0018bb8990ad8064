"""The ``reasoning_hidden`` rule on synthetic per-request counts (issue 23 item 3)."""

from __future__ import annotations

import pytest
from speedmatrix.verdict.names import Flag
from speedmatrix.verdict.reasoning import reasoning_hidden


@pytest.mark.parametrize(
    ("requests", "hidden"),
    [
        ([], False),  # no request: nothing reported
        ([(-1, 0), (-1, 0)], False),  # the server never said
        ([(0, 0), (0, 0)], False),  # no reasoning at all
        ([(100, 100), (80, 80)], False),  # all streamed
        ([(100, 0), (80, 0)], True),  # reported, none streamed
        ([(100, 60), (100, 60)], False),  # 40% unstreamed: under the share
        ([(100, 40), (100, 40)], True),  # 60% unstreamed
        ([(100, 0), (-1, 0)], True),  # the silent request is left out
        ([(10, 500)], False),  # more deltas than reported count no higher than reported
        ([(100, -1)], True),  # a negative streamed count reads as none
    ],
)
def test_reasoning_hidden_table(requests: list[tuple[int, int]], hidden: bool) -> None:
    assert reasoning_hidden(requests) is hidden


def test_the_flag_has_words() -> None:
    assert Flag.REASONING_HIDDEN == "reasoning_hidden"
    assert Flag.REASONING_HIDDEN.text.startswith(Flag.REASONING_HIDDEN.short.split()[0])
