"""The server-side queue rule on sampled `/metrics` series: a server still taking
in the first wave of a cell is not queuing, one that cannot run N at once is.
The ramp series are those the built-in engine's seed-h200 profile gives in a 2 s
window (a serial front-end hands one request to the scheduler every 40 ms)."""

from __future__ import annotations

import numpy as np
import pytest
from speedmatrix.verdict import Rules, held_waiting
from speedmatrix.verdict.names import Status
from speedmatrix.verdict.rules import EngineFacts
from speedmatrix.verdict.server import server_view
from speedmatrix.verdict.status import decode_status

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


def _judge(running, waiting, concurrency, settle_at=0):
    """The status of a closed-loop cell from its sampled series, as the verdict judges it."""
    t_ns = np.arange(len(running), dtype=np.int64) * 250_000_000
    metrics = {
        "names": ["running", "waiting"],
        "t_ns": t_ns,
        "values": np.column_stack([running, waiting]).astype(float).ravel(),
    }
    facts = EngineFacts(metric_running="running", metric_waiting="waiting")
    server = server_view(metrics, facts, int(t_ns[0]), int(t_ns[-1]), int(t_ns[settle_at]))
    status, _ = decode_status(
        Rules(),
        errors={},
        error_examples={},
        started=100,
        output_tokens=1000,
        server=server,
        queued_client=0.0,
        concurrency=concurrency,
    )
    return status


@pytest.mark.parametrize(
    "running, waiting, concurrency, status",
    [
        # llama.cpp, 4 slots, 5 sent, 70 ms requests against 250 ms samples: a sample often
        # falls between a slot freeing and the closed loop's next send, so no two held
        # samples follow each other, yet running never reaches 5 (once judged valid in CI)
        ([4] * 8, [1, 1, 0, 1, 0, 1, 0, 1], 5, Status.QUEUED),
        # the same server at N = 4: running reaches N
        ([4] * 8, [1, 1, 0, 1, 0, 1, 0, 1], 4, Status.VALID),
        # steady state at N with a replacement request seen waiting once
        ([16, 16, 16, 15, 16, 16, 16, 16], [0, 0, 0, 1, 0, 0, 0, 0], 16, Status.VALID),
        # a slow front-end still admitting, one blip: running below N, waiting below the gap
        ([0, 0, 1, 1, 1, 2, 2, 3], [0, 0, 0, 0, 1, 0, 0, 0], 8, Status.VALID),
    ],
)
def test_running_held_below_n_with_waiting_is_queuing(running, waiting, concurrency, status):
    assert _judge(running, waiting, concurrency) is status
