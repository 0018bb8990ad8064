"""The report's client section (report/client.py): per decode cell the loops, CPU and
headroom, and the host's roofline said beside them (fast tier, a run document in memory)."""

from __future__ import annotations

import re

from speedmatrix.report import render_report
from speedmatrix.results import Run

ROOF = {
    "host": "client-1",
    "cpus": 16,
    "measured_at": "2026-12-05T09:00:00+00:00",
    "loops": [{"client_threads": 1, "events_per_s": 50000.0, "requests_per_s": 4000.0}],
}


def _cell(n: int, headroom: float | None, flags: list[str], threads: int = 1) -> dict:
    return {
        "id": f"decode-c512-n{n}-r0",
        "phase": "decode",
        "context": 512,
        "label": "512",
        "concurrency": n,
        "status": "valid",
        "flags": flags,
        "repetition": 0,
        "total_tok_s": 100.0 * n,
        "per_request_tok_s": 50.0,
        "prompt_tok_s": None,
        "tbt_ms": 20.0,
        "ttft_ms": 12.0,
        "avg_active": float(n),
        "completed": 10 * n,
        "output_tokens": 160 * n,
        "measured_s": 10.0,
        "errors": {},
        "client": {"cpu_s": 0.5 * n, "loop_lag_max_ms": 1.0},
        "client_threads": threads,
        "client_headroom": headroom,
    }


def _section(md: str) -> str:
    m = re.search(r"^## Client headroom\n(.*?)(?=^## |\Z)", md, re.MULTILINE | re.DOTALL)
    assert m, "no client section"
    return m.group(1)


def _doc(roof: dict | None, cells: list[dict]) -> dict:
    meta = {
        "run": {"matrix": {"contexts": [512], "concurrency": [c["concurrency"] for c in cells]}}
    }
    if roof is not None:
        meta["client_roofline"] = roof
    return {"schema": "speedmatrix.run/1", "meta": meta, "cells": cells}


def test_each_cell_shows_its_loops_cpu_and_headroom():
    cells = [_cell(1, 25.0, []), _cell(64, 1.4, ["client_near_limit"], threads=2)]
    md, _, _ = render_report(Run(_doc(ROOF, cells)), charts=False)
    sec = _section(md)
    rows = [[x.strip() for x in ln.strip("|").split(" | ")] for ln in sec.splitlines()[2:]]
    rows = [r for r in rows if len(r) == 6 and r[0] == "512"]
    assert [r[2:] for r in rows] == [
        ["1", "0.5", "25.0×", ""],
        ["2", "32.0", "1.4×", "near its limit"],
    ]
    assert "client-1 (16 CPUs" in sec and "50,000 events/s" in sec


def test_without_a_selftest_the_section_says_the_headroom_is_unknown():
    md, _, _ = render_report(Run(_doc(None, [_cell(4, None, [])])), charts=False)
    sec = _section(md)
    assert "—" in sec and "never ran there): the headroom is unknown" in sec


def test_a_predicted_cell_beside_measured_ones_is_left_out_and_breaks_nothing():
    # `run --plan sparse`: the twin's cells carry no client figures and no shard count (NaN
    # in the frame); the report once failed on them ("cannot convert float NaN to integer")
    measured = _cell(1, 25.0, [])
    predicted = {**_cell(8, None, []), "predicted": True, "client_threads": None}
    predicted.pop("client")
    md, _, _ = render_report(Run(_doc(ROOF, [measured, predicted])), charts=False)
    sec = _section(md)
    rows = [[x.strip() for x in ln.strip("|").split(" | ")] for ln in sec.splitlines()[2:]]
    assert [r[1] for r in rows if len(r) == 6 and r[0] == "512"] == ["1"]


def test_a_sharded_run_shows_each_cells_shards():
    cells = [{**_cell(1, 25.0, []), "shards": 2}, {**_cell(64, 3.0, []), "shards": 2}]
    md, _, _ = render_report(Run(_doc(ROOF, cells)), charts=False)
    sec = _section(md)
    assert "Client shards" in sec
    rows = [[x.strip() for x in ln.strip("|").split(" | ")] for ln in sec.splitlines()[2:]]
    assert [r[2] for r in rows if len(r) == 7 and r[0] == "512"] == ["2", "2"]
