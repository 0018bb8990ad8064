"""Issue 23's traffic shapes, their pure parts (fast tier): the matrix fields and their
refusals, the cells they plan, the interference schedule and the session turns, the
figures of a cached-fraction, an interference and a sessions cell from synthetic records,
and the report's views."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from speedmatrix import interference, sessions
from speedmatrix.matrix import Matrix
from speedmatrix.plan import plan
from speedmatrix.records import Records
from speedmatrix.report import traffic as report_traffic
from speedmatrix.results import Run
from speedmatrix.trafficplan import DECODE_PROMPT_TOKENS
from speedmatrix.verdict.cache import cache_columns
from speedmatrix.verdict.cells import CellShape
from speedmatrix.verdict.interference import interference_cell
from speedmatrix.verdict.sessions import session_cell

MS = 1_000_000
SERVER = {"kv_tokens": 1 << 20, "context_length": 32768, "max_running": 64}


# ---- the matrix --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"cached_fraction": "0,0.5,0.9"}, None),
        ({"cached_fraction": [0.5, 0.5]}, "cached_fraction: 0.5 is given twice"),
        ({"cached_fraction": "0.2,x"}, "cached_fraction: [0.2, 'x'] is not a list of shares"),
        ({"cached_fraction": [1.0]}, "cached_fraction: 1.0 is outside [0, 1)"),
        ({"interference_every_s": "2s"}, None),
        ({"interference_every_s": -1.0}, "interference_every_s: -1.0 is not a number"),
        ({"interference_every_s": 30.0}, "interference_every_s: 30 s leaves no prefill"),
        ({"speedup": 2.0}, "speedup: replays a trace; give trace"),
        ({"trace": "t.jsonl", "speedup": 0.0}, "speedup: 0.0 is not a number in (0"),
        (
            {"cached_fraction": [0.5], "interference_every_s": 1.0},
            "interference_every_s: cannot be combined with cached_fraction",
        ),
        (
            {"cached_fraction": [0.5], "request_rates": [1.0]},
            "cached_fraction: cannot be combined with request_rates",
        ),
        ({"trace": "t.jsonl", "search": "rate"}, "trace: cannot be combined with search"),
    ],
)
def test_matrix_fields_and_their_refusals(fields: dict, problem: str | None) -> None:
    found = Matrix(**fields).problems()
    if problem is None:
        assert found == []
    else:
        assert any(p.startswith(problem) for p in found), found


def test_the_fields_survive_a_matrix_file() -> None:
    m = Matrix(cached_fraction=[0.0, 0.9], interference_every_s=0.0)
    assert Matrix.from_toml(m.to_toml()).cached_fraction == [0.0, 0.9]
    m = Matrix(trace="/tmp/t.jsonl", speedup=4.0)
    back = Matrix.from_toml(m.to_toml())
    assert (back.trace, back.speedup) == ("/tmp/t.jsonl", 4.0)


# ---- the plan ----------------------------------------------------------------------------
def test_cached_fraction_cells_one_unique_request_per_slot() -> None:
    m = Matrix(contexts=[1024], concurrency=[1, 4], cached_fraction=[0.0, 0.5, 0.9])
    cells = [c for c in plan(m, **SERVER) if c.phase == "decode"]
    assert [c.id for c in cells] == [
        "decode-c1024-n1-f0-r0",
        "decode-c1024-n1-f0.5-r0",
        "decode-c1024-n1-f0.9-r0",
        "decode-c1024-n4-f0-r0",
        "decode-c1024-n4-f0.5-r0",
        "decode-c1024-n4-f0.9-r0",
    ]
    assert [c.shared_prefix for c in cells[:3]] == [0, 512, 922]
    for c in cells:
        assert c.max_requests == c.prompt_count == c.concurrency
        assert not c.warmup and c.runnable
    assert [c.cached_fraction for c in cells[:3]] == [0.0, 0.5, 0.9]


def test_a_cached_cell_the_server_cannot_hold_is_planned_over_capacity() -> None:
    m = Matrix(contexts=[8192], concurrency=[64], max_output=1024, cached_fraction=[0.5])
    (cell,) = [c for c in plan(m, kv_tokens=65536, context_length=32768, max_running=64)]
    assert cell.status == "over_capacity" and cell.cached_fraction == 0.5


def test_interference_cells_replace_the_decode_grid() -> None:
    m = Matrix(
        contexts=[4096], concurrency=[2, 8], prefill_contexts=[4096], interference_every_s=2.0
    )
    cells = plan(m, **SERVER)
    assert [(c.id, c.phase) for c in cells] == [
        ("prefill-c4096-r0", "prefill"),
        ("interference-c4096-n2-r0", "interference"),
        ("interference-c4096-n8-r0", "interference"),
    ]
    cell = cells[1]
    assert cell.duration_s == m.duration_s and cell.max_requests == 0
    assert cell.interference_every_s == 2.0 and cell.prompt_count == 2


def test_a_trace_plans_one_open_loop_cell(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [(0, 100, 10), (500, 300, 20), (2000, 200, 5)]
    path.write_text(
        "\n".join(
            f'{{"arrival_ms": {a}, "input_tokens": {i}, "output_tokens": {o}}}' for a, i, o in rows
        )
    )
    m = Matrix(trace=str(path), speedup=2.0, max_concurrency=3)
    (cell,) = [c for c in plan(m, **SERVER) if c.phase == "decode"]
    assert (cell.id, cell.label, cell.context) == ("trace-r0", "trace", 200)  # median input
    assert cell.duration_s == pytest.approx(1.0 + 1e-3)  # 2000 ms / 2, past the last
    assert cell.rate_per_s == pytest.approx(3.0)  # three arrivals over one second
    assert (cell.prompt_count, cell.concurrency, cell.arrival) == (3, 3, "trace")


# ---- the interference schedule -----------------------------------------------------------
@pytest.mark.parametrize(
    "every_s, duration_s, count", [(1.0, 10.0, 9), (3.0, 10.0, 3), (0.4, 1.0, 2), (2.0, 1.0, 0)]
)
def test_prefills_fall_inside_the_window(every_s: float, duration_s: float, count: int) -> None:
    assert interference.prefill_count(every_s, duration_s) == count
    due = interference.schedule_ns(3, every_s, duration_s)
    assert due[:3] == [0, 0, 0] and len(due) == 3 + count
    assert all(t < duration_s * 1e9 for t in due)


def test_the_decoders_prompt_is_short() -> None:
    assert DECODE_PROMPT_TOKENS <= 256


# ---- figures from synthetic records ------------------------------------------------------
def _records(requests: dict, events: dict, t0: int, t1: int) -> Records:
    n = len(requests["phase"])
    base = {
        "slot": np.arange(n, dtype=np.int32),
        "scheduled_ns": np.zeros(n, np.int64),
        "http_status": np.full(n, 200, np.int32),
        "output_tokens": np.zeros(n, np.int64),
        "token_source": np.zeros(n, np.uint8),
        "finish_reason": [""] * n,
        "error_kind": [""] * n,
        "error_message": [""] * n,
        "retries": np.zeros(n, np.int32),
    }
    base.update(requests)
    return Records(
        requests=base,
        events=events,
        window_start_ns=t0,
        window_end_ns=t1,
        end_ns=t1,
        warmup_start_ns=t0,
    )


def _cache_records(prompt: list[int], cached: list[int] | None) -> Records:
    n = len(prompt)
    req = {
        "phase": np.ones(n, np.uint8),
        "body": np.arange(n, dtype=np.int32),
        "sent_ns": np.full(n, 1, np.int64),
        "first_byte_ns": np.full(n, 2, np.int64),
        "first_token_ns": np.full(n, 2, np.int64),
        "done_ns": np.full(n, 3, np.int64),
        "outcome": np.ones(n, np.uint8),
        "prompt_tokens": np.asarray(prompt, np.int64),
    }
    if cached is not None:
        req["cached_tokens"] = np.asarray(cached, np.int64)
    ev = {k: np.zeros(0, t) for k, t in (("request", np.int32), ("t_ns", np.int64))}
    ev["tokens"] = np.zeros(0, np.int32)
    return _records(req, ev, 1, 10)


VLLM = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


@pytest.mark.parametrize(
    "prompt, cached, counters, expected, source",
    [
        # the requests' usage wins; a request that said nothing counts 0 (-1 = not said)
        ([1000, 1000], [896, -1], None, 0.448, "usage"),
        # a request cut before its usage came (prompt tokens unknown) is left out
        ([1000, -1], [896, -1], None, 0.896, "usage"),
        # no request said: the counters read around the window
        ([1000, 1000], [-1, -1], ({VLLM[0]: 10, VLLM[1]: 100}, {VLLM[0]: 1010, VLLM[1]: 2100}), 0.5, "counters"),
        # records made before cached_tokens existed: the counters
        ([1000], None, ({VLLM[0]: 0, VLLM[1]: 0}, {VLLM[0]: 900, VLLM[1]: 1000}), 0.9, "counters"),
        ([1000], None, None, None, None),
    ],
)  # fmt: skip
def test_cache_columns(prompt, cached, counters, expected, source) -> None:
    shape = CellShape(
        "decode-c1000-n2-f0.5-r0",
        "decode",
        1000,
        "1K",
        2,
        cached_fraction=0.5,
        cache_counters={"before": counters[0], "after": counters[1]} if counters else None,
    )
    got = cache_columns(shape, _cache_records(prompt, cached))
    assert got["cached_fraction"] == 0.5
    assert got["delivered_cached_source"] == source
    if expected is None:
        assert got["delivered_cached_fraction"] is None
    else:
        assert got["delivered_cached_fraction"] == pytest.approx(expected)
    assert ("cache_counters" in got) == (counters is not None)


def test_a_cell_without_the_axis_has_no_cache_columns() -> None:
    shape = CellShape("decode-c1000-n2-r0", "decode", 1000, "1K", 2)
    assert cache_columns(shape, _cache_records([1000], [500])) == {}


def _interference_records(stall_ms: float, windows: list[tuple[int, int]], streams: int = 2):
    """Decoders (bodies 0..streams-1) with a token every 20 ms, stall_ms while a prefill
    window meets the next gap; the prefills (later bodies) with those windows."""
    n = streams + len(windows)
    first = np.zeros(n, np.int64)
    req_ev, t_ev = [], []
    for s in range(streams):
        t = 50 * MS + s * 3 * MS
        first[s] = t
        while t < 2_000 * MS:
            req_ev.append(s)
            t_ev.append(t)
            hit = any(t < e and b < t + 20 * MS for b, e in windows)
            t += int((stall_ms if hit else 20) * MS)
    sent = np.asarray([0] * streams + [b for b, _ in windows], np.int64)
    first[streams:] = [e for _, e in windows]
    req = {
        "phase": np.ones(n, np.uint8),
        "body": np.arange(n, dtype=np.int32),
        "sent_ns": sent + 1,
        "first_byte_ns": first,
        "first_token_ns": first,
        "done_ns": first + MS,
        "outcome": np.ones(n, np.uint8),
        "prompt_tokens": np.full(n, 100, np.int64),
    }
    ev = {
        "request": np.asarray(req_ev, np.int32),
        "t_ns": np.asarray(t_ev, np.int64),
        "tokens": np.ones(len(t_ev), np.int32),
        "server_ns": np.full(len(t_ev), -1, np.int64),
    }
    return _records(req, ev, 1, 2_000 * MS)


class _Shape:
    id, phase, context, label, repetition = (
        "interference-c4096-n2-r0",
        "interference",
        4096,
        "4K",
        0,
    )
    concurrency = 2
    interference_every_s = 0.5


def test_interference_cell_figures_are_the_stall_over_the_steady_gap() -> None:
    windows = [(500 * MS, 620 * MS), (1_000 * MS, 1_120 * MS), (1_500 * MS, 1_620 * MS)]
    cell = interference_cell(_Shape(), _interference_records(140.0, windows), idle=True)
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["interference_streams"] == 2 and cell["interference_prefills"] == 3
    assert cell["tbt_clear_p99_ms"] == pytest.approx(20.0)
    assert cell["tbt_overlap_p99_ms"] == pytest.approx(140.0)
    assert cell["tbt_inflation"] == pytest.approx(7.0)
    assert cell["gaps_over_100ms"] == 6  # one stall per stream per prefill
    assert cell["interference_every_s"] == 0.5 and cell["phase"] == "interference"


def test_an_interference_cell_without_prefills_is_an_error_that_says_why() -> None:
    cell = interference_cell(_Shape(), _interference_records(140.0, []), idle=True)
    assert cell["status"] == "error"
    assert cell["reason"] == "no prefill reached its first token"
    assert cell["tbt_inflation"] is None


# ---- the report's views ------------------------------------------------------------------
def _interference_frame() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"id": "decode-c1024-n2-r0", "phase": "decode", "context": 1024, "concurrency": 2},
            {
                "id": "interference-c2048-n2-r0",
                "phase": "interference",
                "context": 2048,
                "concurrency": 2,
                "repetition": 0,
                "status": "valid",
                "interference_every_s": 0.5,
                "interference_prefills": 3,
                "tbt_clear_p99_ms": 20.0,
                "tbt_overlap_p99_ms": 102.0,
                "tbt_inflation": 5.1,
                "gaps_over_100ms": 3,
            },
            {
                "id": "interference-c2048-n4-r0",
                "phase": "interference",
                "context": 2048,
                "concurrency": 4,
                "repetition": 0,
                "status": "error",
                "reason": "no prefill reached its first token",
                "interference_prefills": 0,
                "tbt_inflation": None,
            },
        ]
    )


def test_the_interference_section_lists_each_cell_and_says_why_one_failed() -> None:
    section = report_traffic.interference_section(_interference_frame())
    assert section is not None and section.charts == [report_traffic.INTERFERENCE_CHART]
    rows = section.table.rows
    assert [r[:2] for r in rows] == [["2048", "2"], ["2048", "4"]]
    assert rows[0][4:8] == ["20.0", "102.0", "5.10", "3"]
    assert rows[0][-1] == "valid"
    assert rows[1][6] == "—" and rows[1][-1] == "error: no prefill reached its first token"
    fig = report_traffic.inflation_by_streams(_interference_frame())
    (line,) = fig.axes[0].get_lines()[:1]
    assert list(line.get_ydata()) == [5.1]  # the failed cell has no point


def test_a_run_without_traffic_cells_has_no_traffic_sections() -> None:
    plain = pd.DataFrame([{"id": "decode-c1024-n2-r0", "phase": "decode", "context": 1024}])
    assert report_traffic.interference_section(plain) is None
    assert report_traffic.trace_section(plain) is None


def test_the_trace_section_shows_the_lateness_percentiles() -> None:
    cells = pd.DataFrame(
        [
            {
                "id": "trace-r0",
                "phase": "decode",
                "trace": "/data/traces/mooncake.jsonl",
                "speedup": 4.0,
                "open_loop_arrivals": 120,
                "open_loop_completed": 118,
                "queue_p50_ms": 0.4,
                "queue_p90_ms": 1.2,
                "queue_p99_ms": 7.25,
                "ttft_ms": 80.0,
                "status": "valid",
            }
        ]
    )
    section = report_traffic.trace_section(cells)
    assert section is not None
    assert section.table.rows == [
        ["mooncake.jsonl", "4.00", "120", "118", "0.40", "1.20", "7.25", "80.0", "valid"]
    ]
    fig = report_traffic.lateness_by_trace(cells)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [0.4, 1.2, 7.25]


# ---- sessions ----------------------------------------------------------------------------
def test_session_turn_lengths_and_cached_prefixes() -> None:
    assert [sessions.turn_tokens_at(512, 64, 32, k) for k in range(3)] == [512, 608, 704]
    # planned: the previous prompt and its answer of max_output tokens
    assert [sessions.cached_prefix_tokens(512, 64, 32, k) for k in range(3)] == [0, 544, 640]
    assert sessions.final_tokens(512, 64, 32, 3) == 704
    assert sessions.turn_ids(list(range(10)), 1, 5) == [0, 1, 2, 3]  # the server adds a BOS


def test_sessions_cells_are_planned_for_their_last_turn() -> None:
    m = Matrix(contexts=[4096], concurrency=[2, 64], sessions=4, turn_tokens=256, max_output=512)
    cells = plan(m, kv_tokens=200_000, context_length=32768, max_running=64)
    assert [(c.id, c.phase, c.context, c.label) for c in cells] == [
        ("session-c4096-n2-t4-r0", "session", 4096, "4K"),
        ("session-c4096-n64-t4-r0", "session", 4096, "4K"),
    ]
    # last turn: 4096 + 3 x 768 = 6400 prompt tokens + 512 output, times N
    assert cells[0].runnable and cells[0].kv_needed == 2 * (6400 + 512)
    assert cells[1].status == "over_capacity"
    assert (cells[0].sessions, cells[0].turn_tokens, cells[0].max_requests) == (4, 256, 2)


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"sessions": -1}, "sessions: -1 is not a number of turns"),
        ({"sessions": 2, "turn_tokens": 0}, "turn_tokens: 0 is not a positive token count"),
        ({"sessions": 2, "think_time_s": -1.0}, "think_time_s: -1.0 is not a number"),
        ({"sessions": 2, "trace": "t.jsonl"}, "sessions: cannot be combined with trace"),
        ({"sessions": 3, "think_time_s": "1s", "turn_tokens": "1k"}, None),
    ],
)
def test_sessions_fields(fields: dict, problem: str | None) -> None:
    found = Matrix(**fields).problems()
    if problem is None:
        assert found == []
    else:
        assert any(p.startswith(problem) for p in found), found


def _turn(k: int, n: int, t0: int, ttft_ms: float, tokens: int, gap_ms: float):
    """Turn k of n sessions (bodies k x n + s, request rows k x n + s of the cell): sent at
    t0, first token after ttft_ms, then a token each gap_ms."""
    first = t0 + int(ttft_ms * MS)
    req = {
        "phase": np.ones(n, np.uint8),
        "body": k * n + np.arange(n, dtype=np.int32),
        "sent_ns": np.full(n, t0, np.int64),
        "first_byte_ns": np.full(n, first, np.int64),
        "first_token_ns": np.full(n, first, np.int64),
        "done_ns": np.full(n, first + int((tokens - 1) * gap_ms * MS), np.int64),
        "outcome": np.ones(n, np.uint8),
        "prompt_tokens": np.full(n, 100 + k, np.int64),
        "output_tokens": np.full(n, tokens, np.int64),
    }
    times = [first + int(j * gap_ms * MS) for j in range(tokens)]
    ev = {
        "request": np.repeat(k * n + np.arange(n, dtype=np.int32), tokens),
        "t_ns": np.tile(np.asarray(times, np.int64), n),
        "tokens": np.ones(n * tokens, np.int32),
        "server_ns": np.full(n * tokens, -1, np.int64),
    }
    return _records(req, ev, t0, int(req["done_ns"].max()))


def _cell_records(parts: list[Records]) -> Records:
    """A sessions cell's one record set from its turns' rows, in turn order."""
    req = {k: np.concatenate([p.requests[k] for p in parts]) for k in parts[0].requests}
    ev = {k: np.concatenate([p.events[k] for p in parts]) for k in parts[0].events}
    return _records(req, ev, parts[0].window_start_ns, parts[-1].window_end_ns)


def test_session_figures_from_one_record_set() -> None:
    n = 2
    parts = [
        _turn(0, n, 1_000 * MS, 200.0, 11, 10.0),  # ends at 1.3 s
        _turn(1, n, 2_000 * MS, 40.0, 11, 10.0),  # ends at 2.14 s
    ]
    parts[1].requests["cached_tokens"] = np.asarray([96, 80], np.int64)
    parts[0].requests["cached_tokens"] = np.asarray([-1, -1], np.int64)
    merged = _cell_records(parts)
    assert list(merged.requests["body"]) == [0, 1, 2, 3]
    assert list(np.unique(merged.events["request"])) == [0, 1, 2, 3]
    shape = CellShape(
        "session-c100-n2-t2-r0",
        "session",
        100,
        "100",
        n,
        sessions=2,
        turn_tokens=10,
        think_time_s=0.5,
        max_output=11,
    )
    cell = session_cell(shape, merged, idle=True)
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["session_ttft_ms_by_turn"] == [200.0, 40.0]
    assert cell["session_turn_cached_tokens"] == [0, 100]
    assert cell["session_turn_delivered_cached_tokens"] == [None, 88]  # said in turn 2 only
    assert cell["session_tbt_ms"] == pytest.approx(10.0)
    assert cell["session_turns_completed"] == 4
    assert cell["session_duration_s"] == pytest.approx(1.14)
    assert cell["session_turns_per_s"] == pytest.approx(4 / 1.14)
    assert cell["session_output_tok_s"] == pytest.approx(44 / 1.14)


def test_a_session_turn_that_failed_makes_the_cell_an_error() -> None:
    part = _turn(0, 2, 1_000 * MS, 200.0, 5, 10.0)
    part.requests["outcome"][1] = 3
    part.requests["error_kind"][1] = "http_500"
    shape = CellShape("s", "session", 100, "100", 2, sessions=1, turn_tokens=10, max_output=5)
    cell = session_cell(shape, part, idle=True)
    assert cell["status"] == "error"
    assert cell["reason"] == "1 of 2 turns did not complete (http_500: 1)"


def test_the_decode_grid_of_a_cached_run_is_its_smallest_shares_never_a_median() -> None:
    def cell(f: float, tok_s: float) -> dict:
        return {
            "id": f"decode-c512-n2-f{f:g}-r0",
            "phase": "decode",
            "context": 512,
            "concurrency": 2,
            "status": "valid",
            "total_tok_s": tok_s,
            "cached_fraction": f,
        }

    run = Run({"meta": {}, "cells": [cell(0.0, 100.0), cell(0.5, 300.0), cell(0.9, 400.0)]})
    assert run.table("total_tok_s").loc["512", 2] == 100.0  # not 300, the median of the three


def test_the_sessions_section_shows_first_and_last_turn_against_the_cached_prefix() -> None:
    cells = pd.DataFrame(
        [
            {
                "id": "session-c512-n2-t3-r0",
                "phase": "session",
                "context": 512,
                "concurrency": 2,
                "repetition": 0,
                "status": "valid",
                "sessions": 3,
                "session_ttft_ms_by_turn": [110.0, 24.0, 26.0],
                "session_turn_cached_tokens": [0, 512, 608],
                "session_turn_delivered_cached_tokens": [None, 512, 608],
                "session_tbt_ms": 5.0,
                "session_turns_per_s": 2.5,
                "session_output_tok_s": 80.0,
                "session_duration_s": 1.25,
                "session_send_late_p99_ms": 0.4321,
                "session_answer_source": {"stream": 4, "stand_in": 2},
            }
        ]
    )
    section = report_traffic.session_section(cells)
    assert section is not None and section.charts == [report_traffic.SESSION_CHART]
    assert section.table.rows == [
        ["512", "2", "3", "110.0", "26.0 (608 cached, server 608)", "5.0", "2.50", "80.0",
         "1.25", "0.43", "stand_in 2, stream 4", "valid"]
    ]  # fmt: skip
    line = report_traffic.ttft_by_cached_prefix(cells).axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [0, 512, 608]
    assert list(line.get_ydata()) == [110.0, 24.0, 26.0]


def test_the_sessions_answers_column_reads_the_flattened_cells_frame() -> None:
    # Run flattens session_answer_source to session_answer_source_<source> columns
    cell = {
        "id": "session-c512-n2-t3-r0",
        "phase": "session",
        "context": 512,
        "concurrency": 2,
        "status": "valid",
        "sessions": 3,
        "session_ttft_ms_by_turn": [110.0, 24.0, 26.0],
        "session_turn_cached_tokens": [0, 512, 608],
        "session_answer_source": {"stream": 5, "stand_in": 1},
    }
    cells = Run({"meta": {}, "cells": [cell]}).all_cells
    assert "session_answer_source" not in cells.columns
    section = report_traffic.session_section(cells)
    assert section is not None and section.table.rows[0][-2] == "stand_in 1, stream 5"
