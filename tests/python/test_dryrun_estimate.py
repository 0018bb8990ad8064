"""The dry run's (and live ETA's) time model, `dryrun.estimate_cells_s`, on hand-made cells:
warm-up prefill of the new prompts (a shared prefix counted once), the ramp of admitting the
window's N prompts, the window, a fixed overhead; open-loop cells have only their window.
The end-to-end check against a real run is in test_demo.py (the seed matrix)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from speedmatrix import dryrun
from speedmatrix.matrix import Matrix

PRE = dryrun.ASSUMED_PREFILL_TOK_S
ADMIT = dryrun.ASSUMED_ADMIT_TOK_S
OVER = dryrun.CELL_OVERHEAD_S


def cell(context, n, phase="decode", rate=None, rep=0):
    return SimpleNamespace(
        id=f"{phase}-c{context}-n{n}-r{rep}" + (f"-q{rate}" if rate else ""),
        phase=phase,
        context=context,
        concurrency=n,
        repetition=rep,
        status=None,
        duration_s=None,
        rate_per_s=rate,
    )


@pytest.mark.parametrize(
    "context, shared, own",
    [(8192, 0, 8192), (8192, -512, 512), (8192, 1000, 7192), (100, -512, 100), (100, 500, 0)],
)
def test_unique_prompt_tokens(context, shared, own):
    assert dryrun.unique_prompt_tokens(context, shared) == own


def test_shared_prefix_is_prefilled_once_and_every_request_is_admitted():
    m = Matrix(contexts=[8192], concurrency=[1, 4], duration_s=2.0, prefill_contexts=[])
    m.shared_prefix = -512
    cells = [cell(8192, 1), cell(8192, 4)]
    t1, t4 = dryrun.estimate_cells_s(cells, m)
    admit = 8192 / ADMIT
    # N = 1: the context's first prompt in full, admitted in the warm-up and in the window
    assert t1 == pytest.approx(8192 / PRE + admit + 1 * admit + 2.0 + OVER)
    # N = 4: three new prompts, each only its own 512-token tail; four admitted in the ramp
    assert t4 == pytest.approx(3 * 512 / PRE + 3 * admit + 4 * admit + 2.0 + OVER)
    # without the shared prefix the three new prompts are prefilled whole
    m.shared_prefix = 0
    assert dryrun.estimate_cells_s(cells, m)[1] == pytest.approx(
        3 * 8192 / PRE + 3 * admit + 4 * admit + 2.0 + OVER
    )


def test_prompts_already_sent_and_no_warmup():
    m = Matrix(contexts=[4096], concurrency=[4], duration_s=3.0, prefill_contexts=[])
    c = cell(4096, 4)
    admit = 4096 / ADMIT
    # a resumed run that already sent these four prompts: only the ramp and the window
    (t,) = dryrun.estimate_cells_s([c], m, sent={(4096, 0): 4})
    assert t == pytest.approx(4 * admit + 3.0 + OVER)
    # no warm-up: the window's ramp pays the prefill
    m.warmup = False
    (t,) = dryrun.estimate_cells_s([c], m, prefill_tok_s=5000.0)
    assert t == pytest.approx(4 * 4096 / 5000.0 + 4 * admit + 3.0 + OVER)


def test_open_loop_cells_have_only_their_window():
    m = Matrix(contexts=[4096], concurrency=[1], duration_s=5.0, prefill_contexts=[])
    (t,) = dryrun.estimate_cells_s([cell(4096, 8, rate=2.0)], m)
    assert t == pytest.approx(5.0 + OVER)


def test_a_precision_target_makes_the_estimate_a_range_of_windows():
    """--precision ends each closed-loop window between min_duration_s and duration_s: the
    estimate's low end has every window at its shortest; the high end, the cap, is the
    estimate without a precision target. Open-loop windows are not shortened."""
    m = Matrix(contexts=[4096], concurrency=[2], duration_s=30.0, prefill_contexts=[])
    cells = [cell(4096, 2), cell(4096, 2, rate=1.0)]
    fixed = dryrun.estimate_cells_s(cells, m)
    assert dryrun.estimate_cells_s(cells, m, shortest=True) == fixed  # no target: no range
    m.precision, m.min_duration_s = 0.02, 5.0
    assert dryrun.estimate_cells_s(cells, m) == fixed
    low = dryrun.estimate_cells_s(cells, m, shortest=True)
    assert low[0] == pytest.approx(fixed[0] - 25.0)
    assert low[1] == pytest.approx(fixed[1])


def _target(**kw):
    base = {
        "url": "http://127.0.0.1:1", "engine": "sglang", "engine_name": "SGLang", "version": "0.5",
        "model": "m", "kv_tokens": 1_000_000, "context_length": 32768, "max_running": 64, "warnings": [],
        "token_id_prompts": True, "info": {},
    }  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_the_dry_run_says_precision_changes_the_estimate():
    m = Matrix(contexts=[4096], concurrency=[1, 4], duration_s=30.0, prefill_contexts=[])
    plain = dryrun.describe("http://x", m, target=_target())
    m.precision = 0.02
    with_precision = dryrun.describe("http://x", m, target=_target())
    est = [ln for ln in plain.splitlines() if ln.startswith("Estimated duration")]
    est_p = [ln for ln in with_precision.splitlines() if ln.startswith("Estimated duration")]
    assert est != est_p
    assert "precision 0.02 ends each window between 5s and 30s" in est_p[0]
    # the low end: two windows of 5 s instead of 30 s
    assert re.search(r"Estimated duration: (\S+) to (\S+) ", est_p[0])


def test_the_dry_run_lists_every_setting_with_its_source():
    m = Matrix(contexts=[4096], concurrency=[1, 4], prefill_contexts=[], precision=0.02)
    sources = {"contexts": "--contexts", "precision": "file m.toml"}
    text = dryrun.describe("http://x", m, target=_target(), sources=sources)
    rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("  ") and ln.split()}
    for name in m.to_dict():
        assert name in rows, name
    assert rows["contexts"].endswith("--contexts") and "4K" in rows["contexts"]
    assert rows["precision"].endswith("file m.toml") and "0.02" in rows["precision"]
    assert rows["duration_s"].endswith("given")  # no source said: given in Python


def test_the_dry_run_prints_max_running_as_a_count_not_tokens():
    m = Matrix(contexts=[4096], concurrency=[1], prefill_contexts=[])
    text = dryrun.describe("http://x", m, target=_target(max_running=65536))
    assert "max running 65536" in text and "max running 64K" not in text
