"""The sweep's progress display: on a terminal one live status line with the
current cell, its live tok/s and the ETA of the whole matrix; elsewhere a line
per cell. Run against the built-in engine (fixed: ITL 20 ms, so N streams make
about N x 50 tok/s)."""

from __future__ import annotations

import io
import re
import sys

import pytest
from speedmatrix.matrix import Matrix
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(tmp_path, monkeypatch, stream) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    with Sim("fixed") as sim:
        m = Matrix(
            contexts=[128], concurrency=[2, 4], duration_s=1.5, max_output=1000, prefill_contexts=[]
        )
        code = Sweep(sim.url, m, tmp_path, progress=True, report=False).execute()
    assert code == 0
    return stream.getvalue()


def test_terminal_shows_a_live_line_with_tok_s_and_eta(tmp_path, monkeypatch):
    text = _run(tmp_path, monkeypatch, _Terminal())
    updates = [u for u in text.split("\r\x1b[K") if u.strip()]
    live = [u for u in updates if "tok/s," in u and "ETA" in u and "TTFT" not in u]
    assert live, text[-2000:]
    # the live figure of the 4-stream cell, well into its window: about 4 x 50 tok/s
    four = [u for u in live if u.startswith("[2/2]")]
    assert four, text[-2000:]
    tok_s = float(re.search(r"([\d,.]+) tok/s", four[-1]).group(1).replace(",", ""))
    assert 100 < tok_s < 260, four[-1]
    assert re.search(r"ETA \d+m\d\ds", four[-1])
    # each cell ends with its summary on a line of its own
    done = [u for u in updates if "TTFT" in u and "TBT" in u]
    assert [d[:5] for d in done] == ["[1/2]", "[2/2]"], done


def test_not_a_terminal_gives_a_line_per_cell(tmp_path, monkeypatch):
    text = _run(tmp_path, monkeypatch, io.StringIO())
    assert "\x1b[K" not in text  # no cursor control in a log file
    lines = [ln for ln in text.splitlines() if ln.startswith("[")]
    assert lines[0].startswith("[1/2]") and "(ETA " in lines[0], lines
    assert any(ln.startswith("[2/2]") and "tok/s" in ln and "TTFT" in ln for ln in lines), lines


@pytest.mark.parametrize("seconds, text", [(0, "0m00s"), (61, "1m01s"), (3725, "1h02m")])
def test_eta_format(seconds, text):
    from speedmatrix.progress import fmt_eta

    assert fmt_eta(seconds) == text
