"""Latency distributions, SLO attainment/goodput and the capacity answer on synthetic
records (fast tier: no engine, no clock)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from speedmatrix import latency, slo
from speedmatrix.verdict import openloop

MS = 1_000_000
S = 1_000_000_000
T0 = 10 * S


def make_records(rows: list[dict]) -> tuple[dict, dict]:
    """Records from rows of {sched, sent, first, done (ms after T0 or None), out, outcome,
    phase, chunks: [ms, ...] (token arrival times; default evenly from first to done)}."""
    n = len(rows)

    def ns(v):
        return -1 if v is None else T0 + round(v * MS)

    req = {
        "slot": np.arange(n, dtype=np.int32),
        "phase": np.array([r.get("phase", 1) for r in rows], dtype=np.uint8),
        "scheduled_ns": np.array([ns(r.get("sched", r.get("sent"))) for r in rows], np.int64),
        "sent_ns": np.array([ns(r.get("sent")) for r in rows], np.int64),
        "first_token_ns": np.array([ns(r.get("first")) for r in rows], np.int64),
        "done_ns": np.array([ns(r.get("done")) for r in rows], np.int64),
        "output_tokens": np.array([r.get("out", 0) for r in rows], np.int64),
        "outcome": np.array([r.get("outcome", 1) for r in rows], np.uint8),
    }
    ev_req, ev_t, ev_tok = [], [], []
    for i, r in enumerate(rows):
        chunks = r.get("chunks")
        if chunks is None and r.get("first") is not None and r.get("out", 0) > 0:
            k = r["out"]
            end = r["done"] if r.get("done") is not None else r["first"]
            chunks = list(np.linspace(r["first"], end, k)) if k > 1 else [r["first"]]
        for t in chunks or []:
            ev_req.append(i)
            ev_t.append(ns(t))
            ev_tok.append(1)
    ev = {
        "request": np.array(ev_req, np.int32),
        "t_ns": np.array(ev_t, np.int64),
        "tokens": np.array(ev_tok, np.int32),
    }
    return req, ev


# --- percentiles and distributions -------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("50,90,95,99,99.9", (50.0, 90.0, 95.0, 99.0, 99.9)),
        ("99, 50,p90", (50.0, 90.0, 99.0)),
        ("99.99%", (99.99,)),
        ([90, 50, 90], (50.0, 90.0)),
    ],
)
def test_parse_percentiles(text, expected):
    assert latency.parse_percentiles(text) == expected


@pytest.mark.parametrize("text, says", [("0", "between"), ("100", "between"), ("x", "not a")])
def test_parse_percentiles_refuses(text, says):
    with pytest.raises(ValueError, match=says):
        latency.parse_percentiles(text)


def test_distribution_figures_and_intervals():
    v = np.arange(1, 1001, dtype=float)  # 1..1000
    d = latency.distribution(v, (50, 99, 99.9))
    assert d["n"] == 1000
    assert d["mean"] == pytest.approx(500.5)
    # t-interval of the mean: 1.962 * sd / sqrt(n), sd = 288.82
    assert d["mean_ci"][1] - d["mean"] == pytest.approx(1.9623 * 288.8194 / math.sqrt(1000), 1e-3)
    assert d["p50"] == pytest.approx(500.5)
    assert d["p99"] == pytest.approx(990.01)
    assert d["median"] == d["p50"]
    # Order-statistic interval for the median of n=1000: ranks 469 and 532, symmetric about 500.5.
    assert d["median_ci"] == [469.0, 532.0]
    lo, hi = d["ci"]["p99"]
    assert lo < d["p99"] < hi
    assert math.isnan(d["ci"]["p99.9"][1])  # not enough samples above p99.9
    empty = latency.distribution([], (50,))
    assert empty["n"] == 0 and math.isnan(empty["p50"]) and math.isnan(empty["mean"])


# --- per request latencies ---------------------------------------------------------------


def test_per_request_e2e_ttft_tpot_and_scheduled_views():
    req, ev = make_records(
        [
            # sent 40 ms after its schedule; 11 tokens over 100 ms after a 50 ms TTFT
            {"sched": 0, "sent": 40, "first": 90, "done": 190, "out": 11},
            {"sent": 0, "first": 20, "done": 20, "out": 1},  # one token: no TPOT
            {"sent": 0, "first": None, "done": 5, "out": 0, "outcome": 3},  # an error
        ]
    )
    lat = latency.per_request(req, ev)
    assert lat["e2e_ms"][0] == pytest.approx(150)
    assert lat["ttft_ms"][0] == pytest.approx(50)
    assert lat["tpot_ms"][0] == pytest.approx(10)
    assert lat["e2e_sched_ms"][0] == pytest.approx(190)
    assert lat["ttft_sched_ms"][0] == pytest.approx(90)
    assert lat["queue_ms"][0] == pytest.approx(40)
    assert lat["tbt_max_ms"][0] == pytest.approx(10)
    assert math.isnan(lat["tpot_ms"][1])
    assert math.isnan(lat["ttft_ms"][2])


def test_tbt_spreads_a_chunk_over_its_tokens_and_joins_one_read():
    req, _ = make_records([{"sent": 0, "first": 10, "done": 40, "out": 4}])
    ev = {  # tokens at 10 (1), 40 (2 in one chunk), 40 (1 more, same read)
        "request": np.array([0, 0, 0], np.int32),
        "t_ns": np.array([T0 + 10 * MS, T0 + 40 * MS, T0 + 40 * MS], np.int64),
        "tokens": np.array([1, 2, 1], np.int32),
    }
    d = latency.cell_latency(req, ev, T0, T0 + S)
    assert d["tbt_ms"]["n"] == 3  # the 30 ms gap is spread over the 3 tokens it brought
    assert d["tbt_ms"]["median"] == pytest.approx(10)


def test_closed_loop_counts_requests_finished_inside_the_window():
    rows = [
        {"sent": 0, "first": 10, "done": 100, "out": 10},
        {"sent": 100, "first": 110, "done": 1200, "out": 10, "outcome": 2},  # cut at t1: cancelled
        {"sent": 900, "first": 950, "done": 999, "out": 5},
        {"sent": 0, "first": 10, "done": 50, "out": 5, "phase": 0},  # warm-up
    ]
    req, ev = make_records(rows)
    d = latency.cell_latency(req, ev, T0, T0 + S)
    assert d["e2e_ms"]["n"] == 2
    assert d["e2e_ms"]["mean"] == pytest.approx((100 + 99) / 2)
    assert "e2e_sched_ms" not in d


def test_open_loop_counts_every_arrival_and_reports_both_views():
    rows = [
        {
            "sched": k * 100,
            "sent": k * 100 + 20,
            "first": k * 100 + 70,
            "done": k * 100 + 520,
            "out": 10,
        }
        for k in range(10)
    ]
    rows.append(
        {"sched": 1000, "sent": 1000, "first": 1010, "done": 1100, "out": 10}
    )  # after the window
    req, ev = make_records(rows)
    d = latency.cell_latency(req, ev, T0, T0 + S, open_loop=True)
    assert d["e2e_ms"]["n"] == 10
    assert d["e2e_ms"]["median"] == pytest.approx(500)
    assert d["e2e_sched_ms"]["median"] == pytest.approx(520)
    assert d["queue_ms"]["median"] == pytest.approx(20)
    assert d["tpot_ms"]["median"] == pytest.approx(50)


# --- open loop: rate, in flight, keeping up ----------------------------------------------


def test_open_loop_figures_when_the_server_keeps_up():
    rows = [
        {"sched": k * 50, "sent": k * 50, "first": k * 50 + 5, "done": k * 50 + 120, "out": 4}
        for k in range(40)
    ]  # 20/s for 2 s, 120 ms each: 2 to 3 in flight
    req, _ = make_records(rows)
    f = latency.open_loop_figures(req, T0, T0 + 2 * S, 20.0, bin_s=0.5, judge=openloop.kept_up)
    assert f["arrivals"] == 40
    assert f["offered_rate_per_s"] == pytest.approx(20)
    assert f["achieved_rate_per_s"] == pytest.approx(20)
    assert f["interarrival_cv"] == pytest.approx(0, abs=1e-9)
    assert f["completed"] == 40 and f["failed"] == 0 and f["cancelled"] == 0
    assert f["in_flight"] == [1, 3, 3, 3, 2]  # at 0, 0.5, 1.0, 1.5, 2.0 s
    assert f["kept_up"] and f["reason"] == ""


def test_open_loop_figures_when_the_server_falls_behind():
    # The server serves one request every 100 ms but 20/s arrive: the backlog grows.
    rows = []
    for k in range(40):
        done = (k + 1) * 100
        rows.append({"sched": k * 50, "sent": k * 50, "first": done - 10, "done": done, "out": 2})
    req, _ = make_records(rows)
    f = latency.open_loop_figures(req, T0, T0 + 2 * S, 20.0, judge=openloop.kept_up)
    assert f["achieved_rate_per_s"] == pytest.approx(20)
    assert f["completed_rate_per_s"] == pytest.approx(20)  # drained after the window
    assert not f["kept_up"]
    assert "grew" in f["reason"]
    assert f["in_flight"][-1] > f["in_flight"][1]


def test_open_loop_figures_count_unfinished_and_unsent_arrivals():
    rows = [
        {"sched": 0, "sent": 0, "first": 5, "done": 10, "out": 2},
        {"sched": 10, "sent": 10, "first": 20, "done": 3000, "out": 2, "outcome": 2},
        {"sched": 20, "sent": None, "done": 3000, "outcome": 2},
        {"sched": 30, "sent": 30, "done": 40, "outcome": 3},
    ]
    req, _ = make_records(rows)
    f = latency.open_loop_figures(req, T0, T0 + S, 4.0, judge=openloop.kept_up)
    assert (f["completed"], f["failed"], f["cancelled"], f["unsent"]) == (1, 1, 2, 1)
    unjudged = latency.open_loop_figures(req, T0, T0 + S, 4.0)  # figures, no judgement
    assert "kept_up" not in unjudged and unjudged["unsent"] == f["unsent"]
    assert f["achieved_rate_per_s"] == pytest.approx(3)
    assert not f["kept_up"] and "2 of 4" in f["reason"] and "1 never sent" in f["reason"]


# --- SLOs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ttft=2s,tpot=50ms,e2e=60s", {"ttft": 2000.0, "tpot": 50.0, "e2e": 60000.0}),
        ("tbt=0.2", {"tbt": 200.0}),
        ("ITL=100ms, e2e=1m", {"tbt": 100.0, "e2e": 60000.0}),
    ],
)
def test_parse_slo(text, expected):
    assert slo.parse_slo(text) == expected


@pytest.mark.parametrize(
    "text, says",
    [
        ("ttft", "NAME=DURATION"),
        ("latency=2s", "NAME=DURATION"),
        ("ttft=2 parsecs", "unit"),
        ("tpot=0ms", "above 0"),
        ("", "no targets"),
    ],
)
def test_parse_slo_refuses_with_a_reason(text, says):
    with pytest.raises(ValueError, match=says):
        slo.parse_slo(text)


@pytest.mark.parametrize("text, v", [("95%", 0.95), ("95", 0.95), ("0.9", 0.9), ("100%", 1.0)])
def test_parse_attainment(text, v):
    assert slo.parse_attainment(text) == pytest.approx(v)


def test_format_slo_round_trips():
    s = {"ttft": 2000.0, "tpot": 50.0}
    assert slo.parse_slo(slo.format_slo(s)) == s


def test_attainment_and_goodput_by_hand():
    # 2 s window. ttft target 100 ms, tpot 20 ms.
    rows = [
        {"sent": 0, "first": 50, "done": 250, "out": 11},  # ttft 50, tpot 20: meets
        {"sent": 0, "first": 150, "done": 350, "out": 11},  # ttft 150: misses ttft
        {"sent": 0, "first": 50, "done": 550, "out": 11},  # tpot 50: misses tpot
        {"sent": 0, "first": 200, "done": 700, "out": 11},  # misses both
        {"sent": 500, "first": 560, "done": 760, "out": 21},  # ttft 60, tpot 10: meets
        {"sent": 600, "first": None, "done": 610, "out": 0, "outcome": 3},  # error: misses
        {"sent": 700, "first": 720, "done": 720, "out": 1},  # one token: no TPOT, meets
    ]
    req, ev = make_records(rows)
    r = slo.evaluate(req, ev, T0, T0 + 2 * S, {"ttft": 100.0, "tpot": 20.0})
    assert r["counted"] == 7 and r["met"] == 3
    assert r["attainment"] == pytest.approx(3 / 7)
    assert r["goodput_req_s"] == pytest.approx(1.5)
    assert r["goodput_tok_s"] == pytest.approx((11 + 21 + 1) / 2)
    assert r["missed"] == {"ttft": 2, "tpot": 2, "error": 1}
    assert r["failed_most"] in ("ttft", "tpot")


def test_open_loop_slo_is_judged_from_the_scheduled_time():
    rows = [{"sched": 0, "sent": 300, "first": 350, "done": 400, "out": 2}]  # 300 ms at the gate
    req, ev = make_records(rows)
    closed = slo.evaluate(req, ev, T0, T0 + S, {"ttft": 100.0})
    opened = slo.evaluate(req, ev, T0, T0 + S, {"ttft": 100.0}, open_loop=True)
    assert closed["attainment"] == 1.0
    assert opened["attainment"] == 0.0 and opened["failed_most"] == "ttft"


def test_tbt_target_is_the_longest_stall_of_a_request():
    rows = [
        {"sent": 0, "first": 10, "done": 500, "out": 4, "chunks": [10, 20, 480, 500]},
        {"sent": 0, "first": 10, "done": 100, "out": 4, "chunks": [10, 40, 70, 100]},
    ]
    req, ev = make_records(rows)
    r = slo.evaluate(req, ev, T0, T0 + S, {"tbt": 100.0})
    assert r["met"] == 1 and r["missed"]["tbt"] == 1


# --- capacity -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "points, passing, failing, estimate",
    [
        ([(1, 1.0), (2, 1.0), (4, 0.99), (8, 0.85), (16, 0.2)], 4, 8, 4 + (0.04 / 0.14) * 4),
        ([(1, 1.0), (2, 0.5)], 1, 2, 1 + 0.05 / 0.5),
        ([(1, 1.0), (2, 0.99)], 2, None, None),
        ([(1, 0.5), (2, 0.4)], None, 1, None),
        # A noisy pass above a failure does not extend the capacity.
        ([(1, 1.0), (2, 0.9), (4, 0.97)], 1, 2, 1 + 0.05 / 0.1),
        ([(2.0, 0.96), (0.5, 1.0), (1.0, float("nan"))], 2.0, None, None),
    ],
)
def test_capacity_table(points, passing, failing, estimate):
    c = slo.capacity(points, 0.95)
    assert c["passing"] == passing
    assert c["failing"] == failing
    if estimate is None:
        assert c["estimate"] is None
    else:
        assert c["estimate"] == pytest.approx(estimate)
    assert c["method"]


def knee(cap: float):
    """Attainment falling linearly from 1 at `cap` to 0 at 2 * cap (a known knee)."""

    def measure(x: float) -> float:
        return float(min(1.0, max(0.0, 1 - (x - cap) / cap)))

    return measure


@pytest.mark.parametrize(
    "cap, start, integer",
    [(37, 4, True), (5, 64, True), (3.3, 1.0, False), (200, 16, True), (12, 12, True)],
)
def test_search_finds_the_knee_within_ten_percent_in_eight_cells(cap, start, integer):
    calls: list[float] = []
    measure = knee(cap)

    def counted(x: float) -> float:
        calls.append(x)
        return measure(x)

    boundary = cap * 1.05  # attainment 0.95 at 5% above the knee
    r = slo.search(counted, start, 0.95, integer=integer)
    assert r["cells"] == len(calls) == len(set(calls)) <= 8
    assert r["passing"] <= boundary < r["failing"]
    assert r["converged"]
    assert (r["failing"] - r["passing"]) <= max(0.10 * r["passing"], 1 if integer else 0)
    assert r["estimate"] == pytest.approx(boundary, rel=0.10)


def test_search_stops_at_the_lowest_load_when_everything_fails():
    r = slo.search(lambda x: 0.0, 8, 0.95)
    assert r["passing"] is None and r["failing"] == 1 and not r["converged"]


def test_cell_figures_are_json_ready_and_carry_every_part():
    rows = [
        {"sched": k * 100, "sent": k * 100, "first": k * 100 + 30, "done": k * 100 + 200, "out": 5}
        for k in range(10)
    ]
    req, ev = make_records(rows)
    f = slo.cell_figures(req, ev, T0, T0 + S, rate_per_s=10.0, slo={"ttft": 50.0})
    assert set(f) == {"latency", "coalesced_share", "open_loop", "slo"}
    assert f["slo"]["attainment"] == 1.0
    assert f["latency"]["e2e_sched_ms"]["p50"] == pytest.approx(200)
    assert f["latency"]["e2e_ms"]["ci"]["p99.9"][1] is None  # NaN became null
    closed = slo.cell_figures(req, ev, T0, T0 + S)
    assert set(closed) == {"latency", "coalesced_share"}


def test_run_capacity_judges_each_cell_from_its_records():
    # Context 8K at N = 1, 2, 4, 8: 20 requests each, 0, 0, 1 and 6 of them over the 500 ms
    # e2e target (attainment 1, 1, 0.95, 0.7); N = 16 is over capacity (no records).
    cells, recs = [], {}
    for n, slow in ((1, 0), (2, 0), (4, 1), (8, 6)):
        rows = [
            {
                "sent": k * 40,
                "first": k * 40 + 5,
                "done": k * 40 + (600 if k < slow else 100),
                "out": 3,
            }
            for k in range(20)
        ]
        cid = f"decode-c8192-n{n}-r0"
        recs[cid] = make_records(rows)
        cells.append(
            {
                "id": cid,
                "phase": "decode",
                "context": 8192,
                "label": "8K",
                "concurrency": n,
                "status": "valid",
                "records": f"records/{cid}.npz",
                "t0_ns": T0,
                "t1_ns": T0 + S,
            }
        )
    cells.append(
        {
            "id": "decode-c8192-n16-r0",
            "phase": "decode",
            "context": 8192,
            "label": "8K",
            "concurrency": 16,
            "status": "over_capacity",
        }
    )
    caps = slo.run_capacity(cells, recs.get, {"e2e": 500.0}, 0.95)
    c = caps[8192]
    assert (c["passing"], c["failing"], c["by"]) == (4, 8, "concurrency")
    assert c["points"] == [[1, 1.0], [2, 1.0], [4, 0.95], [8, 0.7], [16, 0.0]]
    assert c["estimate"] == pytest.approx(4.0)
    table = slo.capacity_table(caps, {"e2e": 500.0}, 0.95)
    assert "| 8K | concurrency | 4 | 8 | 4 |" in table


def test_closed_loop_requests_cut_at_the_window_end_are_judged_on_what_they_showed():
    # Long outputs: nothing completes in the 1 s window; the cut requests decide.
    rows = [
        {"sent": 0, "first": 50, "done": 1000, "out": 20, "outcome": 2},  # ttft 50, ~50 ms/token
        {"sent": 0, "first": 300, "done": 1000, "out": 8, "outcome": 2},  # ttft 300, 100 ms/token
        {
            "sent": 100,
            "first": 150,
            "done": 1000,
            "out": 4,
            "outcome": 2,
            "chunks": [150, 160, 170, 900],
        },  # a 730 ms stall, tpot so far 250 ms
        {"sent": 990, "first": None, "done": 1000, "outcome": 2},  # no token yet: left out
    ]
    req, ev = make_records(rows)
    r = slo.evaluate(req, ev, T0, T0 + S, {"ttft": 100.0, "tpot": 60.0})
    assert r["counted"] == 3 and r["met"] == 1
    assert r["missed"] == {"ttft": 1, "tpot": 2, "error": 0}  # the second misses both
    assert r["goodput_req_s"] == 0  # none completed
    assert r["goodput_tok_s"] == pytest.approx(20)
    # With an E2E target a cut request is decided only once its elapsed time exceeds it.
    r = slo.evaluate(req, ev, T0, T0 + S, {"e2e": 950.0})
    assert r["counted"] == 2 and r["met"] == 0  # the two sent at 0 ran 1000 ms > 950
    r = slo.evaluate(req, ev, T0, T0 + S, {"e2e": 5000.0})
    assert r["counted"] == 0 and math.isnan(r["attainment"])


def test_closed_loop_counts_the_first_wave_sent_before_the_steady_window():
    # The steady-state window opens once every slot streams, so the first wave was sent
    # before t0. Its requests that finish inside the window count (E2E from their send);
    # cut ones are judged on what they showed; goodput tok/s counts only tokens that
    # arrived inside the window (as total tok/s does).
    rows = [
        # sent in the ramp, finished inside: 10 tokens, 4 of them before t0
        {
            "sent": -400,
            "first": -300,
            "done": 500,
            "out": 10,
            "chunks": [-300, -200, -100, -50] + [100 * k for k in range(1, 7)],
        },
        # sent in the ramp, cut at t1: judged on TTFT and its pace so far
        {"sent": -400, "first": -350, "done": 1000, "out": 5, "outcome": 2},
        # finished before the window opened: not the cell's steady state
        {"sent": -900, "first": -800, "done": -10, "out": 3},
    ]
    req, ev = make_records(rows)
    d = latency.cell_latency(req, ev, T0, T0 + S)
    assert d["e2e_ms"]["n"] == 1 and d["e2e_ms"]["mean"] == pytest.approx(900)
    r = slo.evaluate(req, ev, T0, T0 + S, {"ttft": 200.0})
    assert r["counted"] == 2 and r["met"] == 2
    assert r["goodput_req_s"] == pytest.approx(1.0)  # one completed in the 1 s window
    cut_inside = sum(1 for t in ev["t_ns"][ev["request"] == 1] if T0 <= t <= T0 + S)
    assert r["goodput_tok_s"] == pytest.approx(6 + cut_inside)  # the window's tokens only
