"""Reasoning-aware timing end to end on the built-in engine (known truth, issue 23 item 3): a
chat sweep against ``--reasoning-tokens R`` gives TTFO = TTFT + R inter-token gaps and a
reasoning share of R / output; with the reasoning hidden, TTFT is the first content and the
cell carries ``reasoning_hidden``; the saved run recomputes to the same cells."""

from __future__ import annotations

import pytest
from speedmatrix import runfile
from speedmatrix.matrix import Matrix
from speedmatrix.recompute import recompute_doc
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep

pytestmark = pytest.mark.e2e

REASONING = 10
OUTPUT = 40
ITL_MS = 20.0  # the "fixed" profile: first token after 50 ms, then one every 20 ms
TTFT_MS = 50.0


def _sweep(tmp_path, hidden: bool) -> dict:
    out = tmp_path / ("hidden" if hidden else "streamed")
    m = Matrix(contexts=[128], concurrency=[2], duration_s=3.0, max_output=OUTPUT, api="chat")
    with Sim("fixed", reasoning_tokens=REASONING, reasoning_hidden=hidden) as sim:
        assert Sweep(sim.url, m, out, progress=False, report=False).execute() == 0
    doc = runfile.read_run(out)
    again = recompute_doc(doc, out)
    assert again.changed == [] and again.doc["cells"] == doc["cells"]
    (cell,) = [c for c in doc["cells"] if c["phase"] == "decode"]
    return cell


@pytest.mark.parametrize("hidden", [False, True])
def test_the_split_and_the_share_match_the_engines_settings(tmp_path, hidden: bool) -> None:
    cell = _sweep(tmp_path, hidden)
    silence_ms = REASONING * ITL_MS
    assert cell["reasoning_tokens"] > 0
    assert cell["reasoning_share"] == pytest.approx(REASONING / OUTPUT)
    assert cell["ttfb_ms"] < TTFT_MS  # the headers come before the first token
    assert cell["ttfo_ms"] == pytest.approx(TTFT_MS + silence_ms, abs=15.0)
    if hidden:
        assert cell["ttft_ms"] == pytest.approx(cell["ttfo_ms"], abs=1.0)
        assert "reasoning_hidden" in cell["flags"]
    else:
        assert cell["ttft_ms"] == pytest.approx(TTFT_MS, abs=15.0)
        assert "reasoning_hidden" not in cell["flags"]
