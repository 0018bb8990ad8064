"""The server-side queue rule on sampled `/metrics` series: a server still taking
in the first wave of a cell is not queuing, one that cannot run N at once is.
The ramp series are those the built-in engine's seed-h200 profile gives in a 2 s
window (a serial front-end hands one request to the scheduler every 40 ms)."""

from __future__ import annotations

import numpy as np
import pytest
from speedmatrix.verdict import Rules, held_waiting

QUEUE_GAP_REQUESTS = Rules().queue_gap_requests


def held(running, waiting, judge_from=0):
    w = np.asarray(waiting, dtype=float)
    r = None if running is None else np.asarray(running, dtype=float)
    inside = np.ones(len(w), dtype=bool)
    judged = np.arange(len(w)) >= judge_from
    return held_waiting(w, r, inside, judged)


@pytest.mark.parametrize(
    "running, waiting",
    [
        # 8K x 64 and 16K x 64 on seed-h200: admitted one by one, a request seen
        # between front-end and scheduler now and then
        ([3, 9, 15, 21, 28, 34, 40, 47], [0, 0, 0, 1, 0, 0, 1, 0]),
        ([0, 2, 5, 8, 11, 15, 18, 21], [0, 0, 0, 0, 1, 0, 0, 0]),
        # the series that once read as "0.5 waiting on average" in the second half
        ([5, 12, 20, 27, 33, 40, 46, 52], [0, 0, 0, 0, 0, 1, 1, 0]),
        # a slow front-end: running stays level between samples, one blip
        ([0, 0, 1, 1, 1, 2, 2, 3], [0, 0, 0, 0, 1, 0, 0, 0]),
        # steady state at N with one replacement request seen waiting once
        ([16, 16, 16, 15, 16, 16, 16, 16], [0, 0, 0, 1, 0, 0, 0, 0]),
    ],
)
def test_admission_in_progress_is_not_queuing(running, waiting):
    assert held(running, waiting) < QUEUE_GAP_REQUESTS


@pytest.mark.parametrize(
    "running, waiting, expected",
    [
        # a running cap of 4 with 8 sent: level at the cap, 4 waiting throughout
        ([4, 4, 4, 4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 4, 4, 4], 3.5),
        # the same with requests finishing and being replaced between samples
        ([4, 3, 4, 4, 3, 4, 4, 3], [4, 5, 4, 4, 5, 4, 4, 5], 3.875),
        # one more than the cap: a single request waits all along
        ([4, 4, 4, 4, 4, 4, 4, 4], [1, 1, 1, 1, 1, 1, 1, 1], 0.875),
        # KV pool full: the server retracts running requests back to the queue
        ([40, 40, 38, 36, 36, 35, 35, 34], [0, 0, 2, 4, 4, 5, 5, 6], 3.25),
    ],
)
def test_a_server_that_cannot_run_n_at_once_is_queuing(running, waiting, expected):
    got = held(running, waiting)
    assert got >= QUEUE_GAP_REQUESTS
    assert got == pytest.approx(expected)


def test_without_a_running_count_persistent_waiting_still_counts():
    assert held(None, [0, 3, 3, 3, 3]) == pytest.approx(12 / 5)
    assert held(None, [0, 1, 0, 1, 0, 0]) == 0.0  # isolated blips


def test_only_the_judged_samples_are_averaged():
    # the arrival burst before the first wave settled is not judged
    running, waiting = [0, 4, 8, 8, 8, 8], [8, 4, 0, 0, 0, 0]
    assert held(running, waiting, judge_from=2) == 0.0
    # a cap of 4: level from the second sample on, 4 of 8 waiting
    assert held([0, 4, 4, 4, 4, 4], [8, 4, 4, 4, 4, 4], judge_from=2) == pytest.approx(4.0)


def test_missing_samples_are_not_a_queue():
    nan = float("nan")
    assert held([4, nan, 4, 4], [nan, nan, 0, 0]) == 0.0
    assert held([4], [0], judge_from=1) is None
