"""The catalogue of figures (`speedmatrix.figures`): every run.cells column has one entry,
docs/metrics.md carries the catalogue's table, one figure has one derivation, coalesced
delivery, and what run.cells shows of a plain run (fast tier: synthetic records)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from speedmatrix import figures, latency, slo
from speedmatrix.records import Records
from speedmatrix.results import Run
from speedmatrix.verdict import CellShape, EngineFacts, Rules, decode_cell, prefill_cell

NS = 1_000_000_000
MS = 1_000_000
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _records(
    n: int = 4,
    *,
    burst: int = 1,
    end_s: float = 4.5,
    spread: float = 0.5,
    first_done_s: float | None = 3.0,
) -> Records:
    """``n`` window requests, request i streaming 1 token per 10 ms x (1 + spread x i)
    (``burst`` events per read, reads that many tokens apart; request i 1 ms after request i - 1, so that no read is shared) from
    1.05 s to ``end_s`` of a [1 s, 5 s] window, the first done at ``first_done_s`` and sent
    again."""
    rows = []
    for i in range(n):
        rows.append((1.0, 1.05 + i / 1000, first_done_s if i == 0 and first_done_s else end_s))
    rows.append((3.0, 3.0505, end_s - 0.1))
    m = len(rows)
    req = {
        "slot": np.array(list(range(n)) + [0], np.int32),
        "body": np.zeros(m, np.int32),
        "phase": np.ones(m, np.uint8),
        "scheduled_ns": np.array([int(r[0] * NS) for r in rows], np.int64),
        "sent_ns": np.array([int(r[0] * NS) for r in rows], np.int64),
        "first_token_ns": np.array([int(r[1] * NS) for r in rows], np.int64),
        "done_ns": np.array([int(r[2] * NS) for r in rows], np.int64),
        "http_status": np.full(m, 200, np.int32),
        "prompt_tokens": np.full(m, 100, np.int64),
        "output_tokens": np.zeros(m, np.int64),
        "token_source": np.full(m, 3, np.uint8),
        "outcome": np.ones(m, np.uint8),
        "retries": np.zeros(m, np.int32),
        "finish_reason": [""] * m,
        "error_kind": [""] * m,
        "error_message": [""] * m,
    }
    ev_req, ev_t = [], []
    for i, (_, first, done) in enumerate(rows):
        t = first
        while t < done:
            for _ in range(burst):
                ev_req.append(i)
                ev_t.append(round(t * NS))
            t += 0.01 * burst * (1 + spread * (i % n))
    req["output_tokens"] = np.bincount(ev_req, minlength=m).astype(np.int64)
    ev = {
        "request": np.array(ev_req, np.int32),
        "t_ns": np.array(ev_t, np.int64),
        "tokens": np.ones(len(ev_t), np.int32),
    }
    return Records(
        requests=req,
        events=ev,
        ramp_start_ns=1 * NS,
        window_start_ns=1 * NS,
        window_end_ns=5 * NS,
        warmup_start_ns=-1,
        end_ns=5 * NS,
    )


def _shape(**kw) -> CellShape:
    base = {"id": "decode-c100-n4-r0", "phase": "decode", "context": 100, "label": "100"}
    return CellShape(**{**base, "concurrency": 4, **kw})


def _cells() -> list[dict]:
    """A closed-loop cell, one judged against an SLO, an open-loop one and a prefill cell:
    every kind of column a run writes."""
    rec = _records()
    out = [
        decode_cell(_shape(), rec, EngineFacts(), Rules(), idle=True),
        decode_cell(
            _shape(id="decode-c100-n4-r1", repetition=1),
            rec,
            EngineFacts(),
            Rules(),
            idle=True,
            slo_targets={"ttft": 100.0, "tpot": 50.0},
        ),
        decode_cell(
            _shape(id="decode-c100-q2-r0", concurrency=0, rate_per_s=2.0),
            rec,
            EngineFacts(),
            Rules(),
            idle=True,
            slo_targets={"e2e": 5000.0},
        ),
    ]
    pre = CellShape(id="prefill-c100-r0", phase="prefill", context=100, label="100", concurrency=1)
    out.append(prefill_cell(pre, rec, idle=True))
    return out


def _run(cells: list[dict]) -> Run:
    return Run({"meta": {}, "cells": cells})


# --- the catalogue covers the columns, the docs carry the catalogue ----------------------


def test_every_run_cells_column_has_a_catalogue_entry():
    cols = [str(c) for c in _run(_cells()).all_cells.columns]
    missing = [c for c in cols if figures.find(c) is None]
    assert not missing, f"run.cells columns with no entry in speedmatrix.figures: {missing}"
    assert figures.find("made_up_figure_ms") is None  # the check can fail


def test_docs_metrics_carries_the_catalogue_table():
    text = DOCS.read_text()
    assert figures.markdown_table() in text, (
        "docs/metrics.md's figures table differs from speedmatrix.figures.markdown_table(); "
        "paste the generated table"
    )
    for f in figures.CATALOGUE:
        assert f"`{f.name}`" in text


def test_every_key_a_cell_writes_is_in_the_json_schema():
    from speedmatrix import schema

    cells = _cells()
    props = schema.schema()["$defs"]["cell"]["properties"]
    missing = sorted(set().union(*[c.keys() for c in cells]) - set(props))
    assert not missing, f"run.json cell keys the schema does not name: {missing}"
    doc = {"schema": "speedmatrix.run/1", "meta": {}, "cells": cells}
    schema.check(json.loads(json.dumps(doc)))  # raises on the first problem


def test_entries_are_named_once_and_complete():
    names = [f.name for f in figures.CATALOGUE]
    assert len(names) == len(set(names))
    for f in figures.CATALOGUE:
        assert f.group in figures.GROUPS, f.name
        assert f.definition and f.label and f.summary and f.reads, f.name
        assert f.by == "core" or f.by in (
            "verdict",
            "latency",
            "slo",
            "prefixcache",
            "interference",
            "sessions",
            "twin/model",
            "twin/predictrun",
        ), f.name
    assert figures.RENAMED.keys().isdisjoint(names)  # an old name never names a figure


@pytest.mark.parametrize(
    "column, text",
    [
        ("tbt_ms", "Time between tokens"),
        ("e2e_p99.9_ms", "E2E p99.9"),
        ("ttft_completed_p50_ms", "TTFT (completed) p50"),
        ("tbt_ms_lo", "Time between tokens CI low"),
        ("no_such_column", "no_such_column"),
    ],
)
def test_label(column, text):
    assert figures.label(column) == text


def test_one_confidence_level_and_t_quantile_from_the_core():
    assert figures.CONFIDENCE == 0.95
    assert figures.t_quantile(1) == pytest.approx(12.7062)
    assert figures.t_quantile(30) == pytest.approx(2.0423)
    assert figures.t_quantile(1000) == pytest.approx(1.9623, abs=1e-4)
    assert math.isnan(figures.t_quantile(0))


# --- one figure, one derivation ------------------------------------------------------------


def test_the_tbt_distribution_is_the_cores_tbt_sample_set():
    """run.json's latency.tbt_ms and the core's tbt_ms / p90 / p99 are one set of gaps: its
    p50 is tbt_ms. (Before, the distribution pooled every gap of the requests that completed
    in the window, before t0 too, and one row carried two different median TBTs.)"""
    # request 0 completes at 3 s, the others stream on past the window at their own pace
    cell = decode_cell(_shape(), _records(end_s=6.0), EngineFacts(), Rules(), idle=True)
    dist = cell["latency"]["tbt_ms"]
    assert dist["p50"] == pytest.approx(cell["tbt_ms"], rel=1e-12)
    assert dist["p90"] == pytest.approx(cell["tbt_p90_ms"], rel=1e-12)
    assert dist["p99"] == pytest.approx(cell["tbt_p99_ms"], rel=1e-12)
    # one interval of the median TBT: the core's (per-second bins), not an iid one beside it
    assert cell["ci"]["tbt_ms"][0] is not None
    assert dist["median_ci"] == [None, None] and dist["mean_ci"] == [None, None]
    assert all(v == [None, None] for v in dist["ci"].values())


def test_no_two_code_paths_write_one_run_cells_name():
    """The core's figures and the latency distributions meet in one row: a name the two
    both produce must be the same figure (the tbt percentiles, checked above), never two
    sets of requests under one name. TTFT over completed requests is ``ttft_completed_*``."""
    cell = _cells()[0]
    core_names = {k for k, v in cell.items() if not isinstance(v, dict)}
    row: dict = {}
    from speedmatrix.results import _flatten_latency

    _flatten_latency(cell["latency"], row)
    assert core_names.isdisjoint(row), sorted(core_names & set(row))
    assert "ttft_completed_p50_ms" in row and "ttft_p50_ms" not in row
    assert "tbt_p50_ms" not in row and "tbt_median_ms" not in row  # that is tbt_ms
    assert not any(k.endswith("_median_ms") for k in row)  # the median is the p50


def test_the_core_computes_what_the_catalogue_says_it_does():
    """Every figure the catalogue gives the core is a key of `_core.summarize_cell` (or a
    core function of its name), and each scalar the core returns is catalogued, and stored
    in the cell as the core computed it (the verdict copies, never recomputes)."""
    from speedmatrix._native import _core

    rec = _records()
    pct = sorted({50.0, *latency.DEFAULT_PERCENTILES})
    qs = [p / 100 for p in pct]
    fig = _core.summarize_cell(rec.requests, rec.events, 1 * NS, 5 * NS, 1.0, NS, NS, qs)
    core_funcs = {"coalesced_share"}
    renamed_in_cell = {"errors": "errors_total"}  # the core's count; the cell's is by kind
    for f in figures.CATALOGUE:
        if f.by == "core" and "{" not in f.name:
            assert f.name in fig or f.name in core_funcs, f.name
    cell = decode_cell(_shape(), rec, EngineFacts(), Rules(), idle=True)
    for key, value in fig.items():
        if key.endswith("_ci") or key in ("bin_tok_s", "drifting"):
            continue  # intervals go to ci / {fig}_lo/_hi; bins to plots; drifting to a flag
        if key in ("tbt_count", "tbt_mean_ms", "tbt_quantiles_ms"):
            continue  # the latency distribution's tbt_ms (n, mean, pXX): checked below
        name = renamed_in_cell.get(key, key)
        assert figures.find(name) is not None, key
        assert cell[name] == pytest.approx(value, nan_ok=True), key
    # the TBT sample set's summary reaches the cell's latency distribution unchanged
    tbt = cell["latency"]["tbt_ms"]
    assert fig["tbt_count"] > 0 and tbt["n"] == fig["tbt_count"]
    assert tbt["mean"] == fig["tbt_mean_ms"]
    assert [tbt[latency.percentile_key(p)] for p in pct] == fig["tbt_quantiles_ms"]
    assert tbt["median"] == fig["tbt_ms"] == cell["tbt_ms"]


def test_a_decode_cell_summarizes_its_window_once(monkeypatch):
    """The verdict's figures and the latency distribution's TBT read one summarize_cell."""
    from speedmatrix._native import _core

    calls = []
    real = _core.summarize_cell

    def counting(*args):
        calls.append(args[2:4])
        return real(*args)

    monkeypatch.setattr(_core, "summarize_cell", counting)
    cell = decode_cell(_shape(), _records(), EngineFacts(), Rules(), idle=True)
    assert calls == [(1 * NS, 5 * NS)]
    assert cell["latency"]["tbt_ms"]["n"] > 0


def test_old_column_names_still_find_their_figure():
    run = _run(_cells())
    old, new = run.table("ttft_median_ms"), run.table("ttft_completed_p50_ms")
    assert old.equals(new) and new.notna().any().any()
    assert run.table("tbt_p50_ms").equals(run.table("tbt_ms"))


def test_per_request_stall_and_pace_come_from_the_cores_arrivals():
    """tbt_max_ms (the SLO's tbt) and tpot_so_far_ms read the arrivals: a usage-counted
    request whose chunks said 2 tokens each is scaled to its usage total."""
    rec = _records(n=1)
    req, ev = dict(rec.requests), dict(rec.events)
    ev["tokens"] = np.where(ev["request"] == 0, 2, 1).astype(np.int32)  # chunks over-count 2x
    req["token_source"] = np.array([2, 3], np.uint8)  # kUsageFinal: usage gave the total
    lat = latency.per_request(req, ev)
    # request 0: 195 chunks over 1.05..3.0 s; usage says 195 tokens, not 390
    assert lat["tpot_so_far_ms"][0] == pytest.approx((2.99 - 1.05) * 1000 / 194, rel=1e-3)
    assert lat["tbt_max_ms"][0] == pytest.approx(10.0, rel=1e-3)


def test_goodput_tokens_are_the_window_tokens_total_tok_s_counts():
    """goodput_tok_s counts a met request's window tokens as total tok/s does: usage-scaled
    (the chunks of a usage-counted request over-counted 2x here)."""
    rec = _records(n=2, spread=0)
    req, ev = dict(rec.requests), dict(rec.events)
    ev["tokens"] = np.full(len(ev["t_ns"]), 2, np.int32)
    req["token_source"] = np.full(len(req["sent_ns"]), 2, np.uint8)  # kUsageFinal
    cell = decode_cell(
        _shape(), Records(**{**rec.__dict__, "requests": req, "events": ev}), EngineFacts(),
        Rules(), idle=True, slo_targets={"ttft": 1e6},
    )  # fmt: skip
    assert cell["slo"]["attainment"] == 1.0
    assert cell["slo"]["goodput_tok_s"] == pytest.approx(cell["total_tok_s"], rel=1e-9)


# --- coalesced delivery ---------------------------------------------------------------------


def test_coalesced_bursts_read_as_the_gap_between_reads_spread_over_the_read():
    """A stream that receives its tokens 4 events a read, reads 40 ms apart (10 ms a
    token): TBT 10 ms, per-request 100 tok/s, and every event came coalesced."""
    cell = decode_cell(_shape(), _records(burst=4, spread=0), EngineFacts(), Rules(), idle=True)
    assert cell["tbt_ms"] == pytest.approx(10.0, rel=1e-3)
    assert cell["per_request_tok_s"] == pytest.approx(100.0, rel=1e-3)
    assert cell["latency"]["tbt_ms"]["p50"] == pytest.approx(10.0, rel=1e-3)
    assert cell["coalesced_share"] == pytest.approx(1.0)
    plain = decode_cell(_shape(), _records(spread=0), EngineFacts(), Rules(), idle=True)
    assert plain["coalesced_share"] == 0.0
    assert figures.find("coalesced_share").unit == "share"


@pytest.mark.parametrize(
    "times_ms, share",
    [
        ([(0, 10), (0, 20), (0, 30)], 0.0),  # one stream, one event a read
        ([(0, 10), (0, 10), (0, 20)], 2 / 3),  # two events of a stream in one read
        ([(0, 10), (0, 10.064), (0, 30)], 2 / 3),  # a burst read in two pieces 64 us apart
        ([(0, 10), (0, 11), (0, 12)], 0.0),  # 1 ms apart: a fast stream, not a burst
        ([(0, 10), (1, 10), (0, 20), (1, 21)], 0.0),  # streams never share a read: one stamp each
        ([(0, 10), (1, 10), (1, 10), (0, 2000)], 2 / 3),  # the event after t1 does not count
    ],
)
def test_coalesced_share_table(times_ms, share):
    req = {
        "scheduled_ns": np.zeros(2, np.int64),
        "sent_ns": np.zeros(2, np.int64),
        "first_token_ns": np.full(2, 5 * MS, np.int64),
        "done_ns": np.full(2, 3000 * MS, np.int64),
        "outcome": np.ones(2, np.uint8),
        "phase": np.ones(2, np.uint8),
        "output_tokens": np.full(2, 3, np.int64),
    }
    ev = {
        "request": np.array([q for q, _ in times_ms], np.int32),
        "t_ns": np.array([round(t * MS) for _, t in times_ms], np.int64),
        "tokens": np.ones(len(times_ms), np.int32),
    }
    assert latency.coalesced_share(req, ev, 0, 1000 * MS) == pytest.approx(share)
    assert slo.cell_figures(req, ev, 0, 1000 * MS)["coalesced_share"] == pytest.approx(share)


# --- run.cells of a plain run -----------------------------------------------------------------


def test_a_plain_run_shows_no_columns_it_did_not_measure():
    """A plain closed-loop run whose long outputs never finish inside the window: no SLO,
    no open loop, and no completed request for the E2E/TPOT distributions."""
    rec = _records(end_s=6.0, first_done_s=None)
    run = _run([decode_cell(_shape(), rec, EngineFacts(), Rules(), idle=True)])
    cols, everything = set(run.cells.columns), set(run.all_cells.columns)
    dropped = everything - cols
    assert {"e2e_p99_ms", "tpot_p50_ms", "ttft_completed_p50_ms"} <= dropped
    assert all(figures.find(c).group in figures.OPTIONAL_GROUPS for c in dropped)
    assert all(run.all_cells[c].isna().all() for c in dropped)
    assert not any(c.startswith(("slo_", "open_loop_")) for c in cols)
    # what it measured stays: the headline figures, their intervals, the TBT distribution
    assert {"total_tok_s", "tbt_ms", "ttft_ms", "tbt_ms_lo", "coalesced_share"} <= cols
    assert {"tbt_p95_ms", "tbt_n"} <= cols
    # a run with an SLO keeps its SLO columns
    assert "slo_attainment" in _run(_cells()).cells.columns


def test_cells_repr_rounds_floats_for_display_only():
    run = _run(_cells()[:1])
    df = run.cells
    df.loc[df.index[0], "total_tok_s"] = 116.666667
    with pd.option_context("display.max_columns", None, "display.width", 10_000):
        text = repr(df)
    assert "116.7" in text and "116.666667" not in text
    assert "116.7" in df._repr_html_() and "116.666667" not in df._repr_html_()
    assert df.loc[df.index[0], "total_tok_s"] == 116.666667  # the value is as stored
    part = df[["id", "total_tok_s"]]  # a frame taken from it prints the same way
    assert "116.7" in repr(part) and "116.666667" not in repr(part)
    assert part["total_tok_s"].iloc[0] == 116.666667


# --- end to end: the built-in engine writing bursts -----------------------------------------


@pytest.mark.e2e
def test_the_engine_writing_bursts_reads_as_coalesced_and_tbt_stays_the_streams_pace(tmp_path):
    """The built-in engine unpaced writes each stream's tokens 256 to an HTTP chunk as fast
    as the socket takes them: nearly every event shares a read, and the median TBT, a read's
    gap spread over its events, stays within a small factor of each stream's real decode
    speed (one event per sample would read ~0 ms, per-request speed ~100x too high). The
    same engine paced (20 ms a token) shows no coalescing. (It cannot write bursts at a
    chosen pace, so the known-truth check of the coalesced figure is the fast-tier table.)"""
    import speedmatrix as sm

    m = sm.Matrix(contexts=[256], concurrency=[4], duration_s=2, max_output=100_000)
    with sm.Sim("fixed", unpaced=True) as sim:
        burst = sm.run(sim.url, m, out=tmp_path / "burst", progress=False, report=False)
    m = sm.Matrix(contexts=[256], concurrency=[4], duration_s=2, max_output=2000)
    with sm.Sim("fixed") as sim:
        paced = sm.run(sim.url, m, out=tmp_path / "paced", progress=False, report=False)
    b = burst.cells[burst.cells["phase"] == "decode"].iloc[0]
    p = paced.cells[paced.cells["phase"] == "decode"].iloc[0]
    assert b["coalesced_share"] > 0.9
    assert p["coalesced_share"] < 0.1
    ratio = b["per_request_tok_s"] / b["decode_tok_s_per_request"]
    assert 0.1 < ratio < 10, (b["per_request_tok_s"], b["decode_tok_s_per_request"])
    assert p["tbt_ms"] == pytest.approx(20, rel=0.1)


def test_tbt_samples_are_the_window_requests_own():
    # the samples are those of the window requests alone: a warm-up stream's gaps are not
    from speedmatrix.records import tbt_samples

    ms = 1_000_000
    req = {
        "phase": np.array([0, 1, 1], np.uint8),
        "outcome": np.array([1, 1, 1], np.uint8),
        "sent_ns": np.zeros(3, np.int64),
        "first_token_ns": np.array([1, 5, 6], np.int64) * 1_000_000,
        "done_ns": np.array([4, 65, 66], np.int64) * 1_000_000,
        "prompt_tokens": np.full(3, 8, np.int64),
        "output_tokens": np.array([4, 4, 3], np.int64),
        "token_source": np.full(3, 2, np.uint8),
    }
    ev = {  # a warm-up stream 1 ms a token, two window streams 20 and 30 ms a token
        "request": np.array([0, 1, 2, 0, 0, 1, 2, 0, 1, 2, 1], np.int32),
        "t_ns": np.array([1, 5, 6, 2, 3, 25, 36, 4, 45, 66, 65], np.int64) * ms,
        "tokens": np.ones(11, np.int32),
    }
    order = np.argsort(ev["t_ns"], kind="stable")
    ev = {k: v[order] for k, v in ev.items()}
    assert sorted(tbt_samples(req, ev, 0, 100 * ms)) == [20.0, 20.0, 20.0, 30.0, 30.0]
