"""Reasoning-aware timing on synthetic records (issue 23 item 3): TTFB, TTFT and TTFO side by
side, the reasoning share (the usage's count, else the streamed reasoning chunks), the
``reasoning_hidden`` flag live in a decode cell, records saved before the columns, and the
report's section and chart."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
from speedmatrix import schema
from speedmatrix.reasoning import hidden_evidence, reasoning_figures
from speedmatrix.records import Records
from speedmatrix.report.reasoning import first_output_times, reasoning_section
from speedmatrix.results import Run
from speedmatrix.sim import Sim, profile_path, sim_binary
from speedmatrix.verdict import CellShape, EngineFacts, Rules, decode_cell

NS = 1_000_000_000
MS = 1_000_000
OUTPUT = 40  # tokens a request streams
ITL_MS = 20


def _records(
    reasoning: int, *, hidden: bool = False, reported: bool = True, n: int = 6, columns: bool = True
) -> Records:
    """``n`` window requests of a [1 s, 5 s] window, request i sent at 1 s + 100 ms x i: its
    headers 5 ms later, its first token 50 ms later, then a token every ITL_MS; its first
    ``reasoning`` tokens are reasoning, streamed (``reasoning_deltas``) unless ``hidden`` (then
    the first visible chunk carries them all), reported in the usage when ``reported``."""
    sent = np.array([NS + i * 100 * MS for i in range(n)], np.int64)
    first_token = sent + 50 * MS + (reasoning * ITL_MS * MS if hidden else 0)
    first_content = sent + 50 * MS + reasoning * ITL_MS * MS
    done = sent + 50 * MS + (OUTPUT - 1) * ITL_MS * MS
    req = {
        "slot": np.arange(n, dtype=np.int32),
        "body": np.zeros(n, np.int32),
        "phase": np.ones(n, np.uint8),
        "scheduled_ns": sent.copy(),
        "sent_ns": sent,
        "first_byte_ns": sent + 5 * MS,
        "first_token_ns": first_token,
        "done_ns": done,
        "http_status": np.full(n, 200, np.int32),
        "prompt_tokens": np.full(n, 100, np.int64),
        "output_tokens": np.full(n, OUTPUT, np.int64),
        "token_source": np.full(n, 3, np.uint8),
        "outcome": np.ones(n, np.uint8),
        "retries": np.zeros(n, np.int32),
        "finish_reason": ["length"] * n,
        "error_kind": [""] * n,
        "error_message": [""] * n,
    }
    if columns:
        req["first_content_ns"] = first_content
        req["reasoning_tokens"] = np.full(n, reasoning if reported else -1, np.int64)
        req["reasoning_deltas"] = np.full(n, 0 if hidden else reasoning, np.int32)
        req["cached_tokens"] = np.full(n, -1, np.int64)
    ev_req, ev_t, ev_tok = [], [], []
    for i in range(n):
        t, k = int(first_token[i]), 0
        if hidden and reasoning:  # the hidden tokens arrive with the first visible one
            ev_req.append(i), ev_t.append(t), ev_tok.append(reasoning + 1)
            t, k = t + ITL_MS * MS, reasoning + 1
        while k < OUTPUT:
            ev_req.append(i), ev_t.append(t), ev_tok.append(1)
            t, k = t + ITL_MS * MS, k + 1
    ev = {
        "request": np.array(ev_req, np.int32),
        "t_ns": np.array(ev_t, np.int64),
        "tokens": np.array(ev_tok, np.int32),
    }
    return Records(
        requests=req,
        events=ev,
        ramp_start_ns=NS,
        window_start_ns=NS,
        window_end_ns=5 * NS,
        warmup_start_ns=-1,
        end_ns=5 * NS,
    )


def _cell(rec: Records) -> dict:
    shape = CellShape(
        id="decode-c100-n6-r0", phase="decode", context=100, label="100", concurrency=6
    )
    return decode_cell(shape, rec, EngineFacts(), Rules(), idle=True)


@pytest.mark.parametrize(
    ("reasoning", "hidden", "reported", "ttft_ms", "ttfo_ms", "tokens", "share"),
    [
        (0, False, True, 50.0, 50.0, 0, 0.0),  # a reasoning server that did not think
        (10, False, True, 50.0, 250.0, 60, 0.25),  # streamed: TTFO 10 x 20 ms after TTFT
        (10, True, True, 250.0, 250.0, 60, 0.25),  # hidden: TTFT is the first content
        (10, False, False, 50.0, 250.0, 60, 0.25),  # unreported: the streamed chunks count
        (0, False, False, 50.0, 50.0, None, None),  # no reasoning channel at all
    ],
)
def test_the_figures_match_the_requests_built(
    reasoning: int,
    hidden: bool,
    reported: bool,
    ttft_ms: float,
    ttfo_ms: float,
    tokens: int | None,
    share: float | None,
) -> None:
    rec = _records(reasoning, hidden=hidden, reported=reported)
    fig = reasoning_figures(rec.requests, NS, 5 * NS)
    assert fig["ttfb_ms"] == pytest.approx(5.0)
    assert fig["ttfo_ms"] == pytest.approx(ttfo_ms)
    assert fig["reasoning_tokens"] == tokens
    assert fig["reasoning_share"] == (None if share is None else pytest.approx(share))
    cell = _cell(rec)
    assert cell["ttft_ms"] == pytest.approx(ttft_ms, abs=0.01)
    assert cell["ttfo_ms"] == pytest.approx(ttfo_ms)
    assert ("reasoning_hidden" in cell["flags"]) is (hidden and reasoning > 0)


def test_only_requests_sent_from_the_ramp_and_completed_ones_count() -> None:
    rec = _records(10)
    req = rec.requests
    req["first_content_ns"][0] = req["sent_ns"][0] + 900 * MS  # a slow one, sent before the ramp
    req["outcome"][1] = 3  # an error: its reasoning is not the cell's
    req["reasoning_tokens"][1] = 1000
    fig = reasoning_figures(req, int(req["sent_ns"][1]), 5 * NS)
    assert fig["ttfo_ms"] == pytest.approx(250.0)
    assert fig["reasoning_tokens"] == 50 and fig["reasoning_share"] == pytest.approx(0.25)
    assert hidden_evidence(req) == ((10, 10),) * 5


def test_records_saved_before_the_columns_give_ttfb_only() -> None:
    rec = _records(10, columns=False)
    fig = reasoning_figures(rec.requests, NS, 5 * NS)
    assert fig == {
        "ttfb_ms": pytest.approx(5.0),
        "ttfo_ms": None,
        "reasoning_tokens": None,
        "reasoning_share": None,
    }
    assert hidden_evidence(rec.requests) == ()
    assert "reasoning_hidden" not in _cell(rec)["flags"]


def test_the_cells_keys_are_in_the_schema_and_run_cells_columns() -> None:
    cells = [_cell(_records(10, hidden=True)), _cell(_records(0, reported=False))]
    schema.check(
        json.loads(json.dumps({"schema": "speedmatrix.run/1", "meta": {}, "cells": cells}))
    )
    table = Run({"meta": {}, "cells": cells}).all_cells
    assert list(table["reasoning_share"].fillna(-1)) == [0.25, -1]
    assert list(table["ttfo_ms"]) == pytest.approx([250.0, 50.0])


def test_the_report_shows_a_section_and_chart_only_with_reasoning() -> None:
    plain = pd.DataFrame([{"phase": "decode", "context": 100, "concurrency": 1, "flags": []}])
    assert reasoning_section(plain) is None
    cells = pd.DataFrame(
        [
            Run({"meta": {}, "cells": [_cell(_records(10, hidden=True))]}).all_cells.iloc[0],
            Run({"meta": {}, "cells": [_cell(_records(10))]}).all_cells.iloc[0],
            Run({"meta": {}, "cells": [_cell(_records(0, reported=False))]}).all_cells.iloc[0],
        ]
    )
    section = reasoning_section(cells)
    assert section is not None and section.table is not None
    assert section.charts == ["first_output_times"]
    rows = section.table.rows
    assert len(rows) == 2  # the cell without reasoning is left out
    assert {r[-1] for r in rows} == {"reasoning hidden", ""}
    assert [r[5] for r in rows] == ["25.0%", "25.0%"]
    fig = first_output_times(cells)
    bars = [p.get_height() for p in fig.axes[0].patches]
    assert len(bars) == 6  # three times for each of the two cells
    assert max(bars) == pytest.approx(250.0)
    names = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert names == ["C=100 N=6 hidden", "C=100 N=6"]


@pytest.mark.parametrize("value", ["-3", "ten", "4x"])
def test_the_engine_refuses_a_bad_reasoning_count_in_one_line(value: str) -> None:
    r = subprocess.run(
        [
            str(sim_binary()),
            "--profile",
            str(profile_path("test-fast")),
            "--reasoning-tokens",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"speedmatrix-sim: --reasoning-tokens wants a count >= 0, got '{value}'"
    ]


def test_the_python_wrapper_passes_the_reasoning_flags() -> None:
    sim = Sim("test-fast", reasoning_tokens=7, reasoning_hidden=True, start=False)
    assert sim.args[-3:] == ["--reasoning-tokens", "7", "--reasoning-hidden"]
    assert "--reasoning-tokens" not in Sim("test-fast", start=False).args
