"""Issue 23's traffic shapes through the whole sweep on the built-in engine (known truth):
the cached-fraction axis delivers the asked share and TTFT falls as the prefill model says,
the interference cell's inflation is the prefill over the step, a trace is replayed on
its schedule with each request's own lengths; each has its report section, and
`recompute` rebuilds each cell from its records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from speedmatrix.matrix import Matrix
from speedmatrix.recompute import recompute_doc
from speedmatrix.report.render import render_report
from speedmatrix.results import load
from speedmatrix.show import grid_text
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep

pytestmark = pytest.mark.e2e


def _sweep(url: str, matrix: Matrix, out: Path) -> tuple[dict, dict]:
    assert Sweep(url, matrix, out, progress=False, report=False).execute() == 0
    doc = json.loads((out / "run.json").read_text())
    return doc, {c["id"]: c for c in doc["cells"]}


def _recomputes_to_itself(doc: dict, out: Path) -> None:
    again = recompute_doc(doc, out)
    assert again.changed == [], again.changed


def _section(out: Path, title: str, chart: str) -> str:
    md, _html, svgs = render_report(load(out))
    assert f"## {title}" in md and chart in svgs
    return md


CONTEXT = 1024
PREFILL_US = 300.0  # per uncached prompt token: a cold 1024-token prompt takes 307 ms


def test_cached_fraction_axis(tmp_path: Path) -> None:
    overrides = {
        "prefill_per_token_us": PREFILL_US,
        "step_base_ms": 5.0,
        "step_per_seq_ms": 0.0,
        "step_per_kv_token_ns": 0.0,
        "kv_tokens": 65536,
        "context_length": 8192,
    }
    m = Matrix(
        contexts=[CONTEXT],
        concurrency=[2],
        cached_fraction=[0.0, 0.5, 0.9],
        duration_s=1.0,
        max_output=32,
        prefill_contexts=[],
    )
    with Sim("test-batch", flavour="vllm", overrides=overrides) as sim:
        doc, cells = _sweep(sim.url, m, tmp_path)
    ttfts = []
    for f in m.cached_fraction:
        cell = cells[f"decode-c{CONTEXT}-n2-f{f:g}-r0"]
        assert cell["status"] == "valid", cell.get("reason")
        assert cell["cached_fraction"] == f
        # the engine caches whole 16-token blocks: within 2 points of the asked share
        assert abs(cell["delivered_cached_fraction"] - f) <= 0.02, cell
        assert cell["delivered_cached_source"] in ("usage", "counters")
        assert "cache_hit_mismatch" not in cell["flags"]
        assert cell["prompt_tokens"]["exact"]
        # two requests at once: the second waits for the first's prefill (one engine)
        model_ms = CONTEXT * (1 - cell["delivered_cached_fraction"]) * PREFILL_US / 1000
        assert model_ms <= cell["ttft_ms"] <= 2 * model_ms + 80, (f, cell["ttft_ms"])
        ttfts.append(cell["ttft_ms"])
    assert ttfts[0] > ttfts[1] > ttfts[2]
    _recomputes_to_itself(doc, tmp_path)
    md = _section(tmp_path, "Prefix cache", "ttft_vs_cached_fraction")
    assert "90.0%" in md


STEP_MS = 20.0
PREFILL_TOKEN_US = 40.0  # a 2048-token prefill takes 82 ms


def test_interference_cell(tmp_path: Path) -> None:
    overrides = {
        "prefill_per_token_us": PREFILL_TOKEN_US,
        "step_base_ms": STEP_MS,
        "step_per_seq_ms": 0.0,
        "step_per_kv_token_ns": 0.0,
        "kv_tokens": 1 << 20,
        "context_length": 1 << 16,
        "chunk_tokens": 4096,
    }
    m = Matrix(
        contexts=[2048],
        concurrency=[3],
        interference_every_s=0.5,
        duration_s=3.0,
        max_output=10_000,
        prefill_contexts=[],
    )
    with Sim("test-batch", overrides=overrides) as sim:
        doc, cells = _sweep(sim.url, m, tmp_path)
    cell = cells["interference-c2048-n3-r0"]
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["interference_prefills"] == 5
    truth = (2048 * PREFILL_TOKEN_US / 1000 + STEP_MS) / STEP_MS  # 5.1
    assert 0.4 * truth <= cell["tbt_inflation"] <= 1.1 * truth
    _recomputes_to_itself(doc, tmp_path)
    _section(tmp_path, "Prefill interference", "interference_inflation")


def test_a_trace_sessions_later_turn_carries_its_previous_prompt(tmp_path: Path) -> None:
    """Our JSONL with session ids: each session's second turn starts with the whole prompt
    of its first (the conversation so far) and the engine finds it cached; the other
    session's prompts share nothing with it."""
    rows = [(0, 600, "a"), (200, 600, "b"), (1000, 800, "a"), (1200, 800, "b")]
    trace = tmp_path / "sessions.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"arrival_ms": t, "input_tokens": n, "output_tokens": 4, "session": s})
            for t, n, s in rows
        )
    )
    overrides = {"prefill_per_token_us": PREFILL_US, "step_base_ms": 5.0, "kv_tokens": 65536}
    m = Matrix(trace=str(trace), prefill_contexts=[], max_output=16)
    out = tmp_path / "run"
    with Sim("test-batch", overrides=overrides) as sim:
        _doc, cells = _sweep(sim.url, m, out)
    assert cells["trace-r0"]["open_loop"]["completed"] == 4
    req = load(out).records("trace-r0").requests
    window = np.flatnonzero(req["phase"] == 1)
    by_row = {int(req["body"][i]): i for i in window}
    assert [int(req["prompt_tokens"][by_row[k]]) for k in range(4)] == [600, 600, 800, 800]
    cached = [int(req["cached_tokens"][by_row[k]]) for k in range(4)]
    # first turns cold; a second turn: its session's 600-token prompt (whole 16-token blocks)
    assert cached[0] == 0 and cached[1] == 0, cached
    assert 600 - 16 <= cached[2] <= 600 and 600 - 16 <= cached[3] <= 600, cached


def test_trace_replay(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    arrivals = np.sort(rng.uniform(0, 2000, 24)).round(3)
    inputs = rng.integers(64, 400, 24)
    outputs = rng.integers(2, 12, 24)
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"arrival_ms": float(a), "input_tokens": int(i), "output_tokens": int(o)})
            for a, i, o in zip(arrivals, inputs, outputs)
        )
    )
    m = Matrix(trace=str(trace), speedup=2.0, prefill_contexts=[], max_output=16)
    out = tmp_path / "run"
    with Sim("test-fast") as sim:
        doc, cells = _sweep(sim.url, m, out)
    cell = cells["trace-r0"]
    assert cell["status"] in ("valid", "queued"), cell.get("reason")
    assert cell["open_loop"]["arrivals"] == 24 and cell["open_loop"]["completed"] == 24
    run = load(out)
    req = run.records("trace-r0").requests
    window = req["phase"] == 1
    # each request was sent at its arrival / 2, with its own prompt and output lengths
    due_ms = (req["scheduled_ns"][window] - req["scheduled_ns"][window].min()) / 1e6
    assert due_ms == pytest.approx((arrivals - arrivals.min()) / 2, abs=0.01)
    order = req["body"][window]
    assert (req["prompt_tokens"][window] == inputs[order]).all()
    assert (req["output_tokens"][window] == outputs[order]).all()
    late_ms = (req["sent_ns"][window] - req["scheduled_ns"][window]) / 1e6
    assert np.percentile(late_ms, 50) < 20  # a loaded machine sends late, in bursts
    _recomputes_to_itself(doc, out)
    _section(out, "Trace replay", "trace_lateness")


SESSION_PREFILL_US = 200.0  # per uncached prompt token


def test_sessions(tmp_path: Path) -> None:
    overrides = {
        "prefill_per_token_us": SESSION_PREFILL_US,
        "step_base_ms": 5.0,
        "step_per_seq_ms": 0.0,
        "step_per_kv_token_ns": 0.0,
        "kv_tokens": 1 << 20,
        "context_length": 1 << 16,
    }
    m = Matrix(
        contexts=[512],
        concurrency=[2],
        sessions=3,
        turn_tokens=64,
        think_time_s=0.2,
        max_output=32,
        duration_s=20.0,
        prefill_contexts=[],
    )
    with Sim("test-batch", flavour="vllm", overrides=overrides) as sim:
        doc, cells = _sweep(sim.url, m, tmp_path)
    cell = cells["session-c512-n2-t3-r0"]
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["session_turns_completed"] == 6
    # each turn finds the previous prompt and the answer the engine gave (its ids streamed:
    # the vllm flavour with return_token_ids), 512 + 32 and 608 + 32
    assert cell["session_answer_source"] == {"stream": 6}
    assert cell["session_turn_cached_tokens"] == [0, 544, 640]
    # the engine reports what it served from its cache (whole 16-token blocks: all of it;
    # nothing said for the first turn, which it served cold)
    said = cell["session_turn_delivered_cached_tokens"]
    assert said[0] in (None, 0) and said[1:] == [544, 640]
    req = load(tmp_path).records(cell["id"]).requests
    turn = req["body"] // 2
    # exact prompt lengths per turn: C, C + (32 + 64), C + 2 (32 + 64)
    assert [sorted(set(req["prompt_tokens"][turn == k])) for k in range(3)] == [
        [512],
        [608],
        [704],
    ]
    # each turn computes what the server had not seen: the whole first prompt, then the
    # new message (64 tokens; the engine caches whole 16-token blocks)
    ttft = cell["session_ttft_ms_by_turn"]
    first_ms = 512 * SESSION_PREFILL_US / 1000
    assert first_ms <= ttft[0] <= 2 * first_ms + 80
    for k in (1, 2):
        assert ttft[k] < ttft[0] / 2, ttft
    assert cell["session_tbt_ms"] == pytest.approx(5.0, abs=3.0)
    # three turns of 32 tokens and two pauses of 0.2 s per session
    assert 0.4 <= cell["session_duration_s"] <= 3.0
    _recomputes_to_itself(doc, tmp_path)
    _section(tmp_path, "Sessions", "session_ttft_vs_cached_prefix")
    # `speedmatrix show`: no empty decode grid for a run of sessions only, the cell's line
    shown = grid_text(load(tmp_path))
    assert "Sustained decode" not in shown and "Not measured" not in shown
    assert "  session-c512-n2-t3-r0: Turns/s " in shown and shown.rstrip().endswith("Valid")


def test_trace_requests_sharing_blocks_share_their_prompt_prefix(tmp_path: Path) -> None:
    """Mooncake rows: the second request repeats the first's two leading 512-token blocks
    and finds them cached; the third shares none and pays its whole prefill."""
    rows = [
        (0, 1030, [1, 2, 3]),
        (1000, 1100, [1, 2, 4]),
        (2000, 1030, [9, 10, 11]),
    ]
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": h})
            for t, n, h in rows
        )
    )
    overrides = {
        "prefill_per_token_us": PREFILL_US,
        "step_base_ms": 5.0,
        "kv_tokens": 65536,
        "context_length": 8192,
    }
    m = Matrix(trace=str(trace), prefill_contexts=[], max_output=16)
    out = tmp_path / "run"
    with Sim("test-batch", overrides=overrides) as sim:
        _doc, cells = _sweep(sim.url, m, out)
    assert cells["trace-r0"]["open_loop"]["completed"] == 3
    req = load(out).records("trace-r0").requests
    order = np.argsort(req["scheduled_ns"])
    ttft_ms = ((req["first_token_ns"] - req["sent_ns"]) / 1e6)[order]
    assert list(req["prompt_tokens"][order]) == [1030, 1100, 1030]
    cold_ms = 1030 * PREFILL_US / 1000
    assert ttft_ms[0] >= cold_ms and ttft_ms[2] >= cold_ms
    assert ttft_ms[1] < 0.3 * ttft_ms[0]  # 1,024 of its 1,100 tokens were cached
