"""The client's headroom and its roofline lookup (speedmatrix.verdict.client), as tables;
and a decode cell judged with and without a roofline (fast tier, synthetic records)."""

from __future__ import annotations

import pytest
from speedmatrix.verdict import EngineFacts, Rules, decode_cell
from speedmatrix.verdict.client import client_headroom, limit_for, near_limit
from test_verdict_cells import SHAPE, _records  # the synthetic two-stream cell

ROOF = {
    "loops": [
        {"client_threads": 1, "events_per_s": 1000.0, "requests_per_s": 100.0},
        {"client_threads": 2, "events_per_s": 1800.0, "requests_per_s": 190.0},
        {"client_threads": 4, "events_per_s": 3000.0, "requests_per_s": 300.0},
    ]
}


@pytest.mark.parametrize(
    ("threads", "want"),
    [
        (1, (1000.0, 100.0)),
        (2, (1800.0, 190.0)),
        (3, (1800.0, 190.0)),  # the most loops not above 3
        (8, (3000.0, 300.0)),
        (0, (1000.0, 100.0)),  # auto read as one
    ],
)
def test_the_row_with_the_most_loops_not_above_the_cells(threads, want):
    assert limit_for(ROOF, threads) == want


def test_no_roofline_or_no_usable_row_is_no_limit():
    assert limit_for(None, 1) is None
    assert limit_for({}, 1) is None
    assert limit_for({"loops": [{"client_threads": 1, "events_per_s": 0}]}, 1) is None
    only_more = {"loops": [{"client_threads": 4, "events_per_s": 10.0, "requests_per_s": 1.0}]}
    assert limit_for(only_more, 1) == (10.0, 1.0)


@pytest.mark.parametrize(
    ("events", "requests", "want"),
    [
        (500.0, 10.0, 2.0),  # events bind: 1000 / 500
        (100.0, 50.0, 2.0),  # requests bind: 100 / 50
        (2000.0, 1.0, 0.5),  # over the roofline
        (0.0, 0.0, None),  # no demand
        (0.0, 25.0, 4.0),  # no token events: requests alone
    ],
)
def test_headroom_is_the_smaller_ratio(events, requests, want):
    assert client_headroom(events, requests, (1000.0, 100.0)) == want


@pytest.mark.parametrize(
    ("headroom", "flag"), [(None, False), (2.0, False), (1.99, True), (0.3, True), (50.0, False)]
)
def test_near_limit_below_the_least_headroom(headroom, flag):
    assert near_limit(headroom, 2.0) is flag


def _judged(roofline: dict | None, threads: int = 1) -> dict:
    records = _records()
    records.client_threads = threads
    return decode_cell(SHAPE, records, EngineFacts(), Rules(), idle=True, client_roofline=roofline)


def test_a_cell_near_the_roofline_is_flagged_with_its_headroom():
    # the cell: ~97 token events and 2 finished requests in a 1.95 s window (~50 events/s)
    tight = {"loops": [{"client_threads": 1, "events_per_s": 80.0, "requests_per_s": 1000.0}]}
    cell = _judged(tight)
    assert cell["client_headroom"] == pytest.approx(80 / (97 / 1.95), rel=0.03)
    assert "client_near_limit" in cell["flags"]
    roomy = {"loops": [{"client_threads": 1, "events_per_s": 1000.0, "requests_per_s": 100.0}]}
    cell = _judged(roomy)
    assert cell["client_headroom"] == pytest.approx(1000 / (97 / 1.95), rel=0.03)
    assert "client_near_limit" not in cell["flags"]
    # the cell's own loop count picks the row: with 2 loops the roomier one
    both = {"loops": [tight["loops"][0], {**roomy["loops"][0], "client_threads": 2}]}
    assert "client_near_limit" in _judged(both, threads=1)["flags"]
    assert "client_near_limit" not in _judged(both, threads=2)["flags"]


def test_without_a_selftest_there_is_no_headroom_and_no_flag():
    cell = _judged(None)
    assert cell["client_headroom"] is None
    assert "client_near_limit" not in cell["flags"]


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_a_sharded_cells_demand_is_spread_over_its_shards(shards):
    # --ray --shards: each shard's host takes 1/K of the window's events
    tight = {"loops": [{"client_threads": 1, "events_per_s": 80.0, "requests_per_s": 1000.0}]}
    records = _records()
    records.shards = shards
    cell = decode_cell(SHAPE, records, EngineFacts(), Rules(), idle=True, client_roofline=tight)
    assert cell["shards"] == shards
    assert cell["client_headroom"] == pytest.approx(shards * 80 / (97 / 1.95), rel=0.03)
    assert ("client_near_limit" in cell["flags"]) is (shards == 1)
