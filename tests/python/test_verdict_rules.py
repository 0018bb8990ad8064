"""Every judgement of speedmatrix.verdict on synthetic inputs (fast tier): each flag rule,
the status rule, one status for repetitions, the exit status, whether an open loop kept
up, and what the records say about usage and the warm-up."""

from __future__ import annotations

import json

import numpy as np
import pytest
from speedmatrix import runfile
from speedmatrix.verdict import (
    FLAG_RULES,
    REPORTED,
    Evidence,
    ExitStatus,
    Flag,
    Rules,
    Status,
    client_queue_signal,
    combined_status,
    decode_status,
    error_kind,
    exit_status,
    first_wave_settled,
    first_wave_streamed,
    flags_of,
    kept_up,
    reported_flags,
    usage_mismatches,
    warmup_unfinished,
)

# ---- each flag rule: (flag, evidence that raises it, evidence just short of it) ----------
# The "short" case sits at the rule's edge, so a rule that flags everything or nothing,
# or that moved its threshold, fails here.
FLAG_CASES = [
    (Flag.BUSY_AT_START, {"idle": False}, {"idle": True}),
    (Flag.OUTPUT_NOT_FORCED, {"output_forced": False}, {"output_forced": True}),
    (Flag.DRIFT, {"drifting": True}, {"drifting": False}),
    (Flag.PROMPT_MISMATCH, {"prompt_exact": False}, {"prompt_exact": None}),
    (Flag.ESTIMATED_TOKENS, {"tokens_estimated": True}, {"tokens_estimated": False}),
    # 0.85 of a core over the cell: 8.6 s of CPU in 10 s flags, 8.5 s does not
    (
        Flag.CLIENT_BOUND,
        {"client_cpu_s": 8.6, "cell_s": 10.0},
        {"client_cpu_s": 8.5, "cell_s": 10.0},
    ),
    # a roofline 1.99 times the cell's demand flags, 2 times does not, none does not
    (Flag.CLIENT_NEAR_LIMIT, {"client_headroom": 1.99}, {"client_headroom": 2.0}),
    (Flag.CLIENT_NEAR_LIMIT, {"client_headroom": 0.5}, {"client_headroom": None}),
    # N 4: more than 4 x 1.1 + 0.5 = 4.9 running on average
    (
        Flag.SERVER_RUNNING_MISMATCH,
        {"concurrency": 4, "running_mean": 5.0},
        {"concurrency": 4, "running_mean": 4.9},
    ),
    # an open loop without a concurrency bound (N 0) has nothing to compare with
    (
        Flag.SERVER_RUNNING_MISMATCH,
        {"concurrency": 2, "open_loop": True, "kept_up": True, "running_mean": 9.0},
        {"concurrency": 0, "open_loop": True, "kept_up": True, "running_mean": 9.0},
    ),
    # more than 5 % of 100 sent
    (
        Flag.TTFT_UNSERVED,
        {"started": 100, "unserved_longer": 6},
        {"started": 100, "unserved_longer": 5},
    ),
    (Flag.STALLS, {"stalls": 1}, {"stalls": 0}),
    (Flag.RATE_LIMITED, {"http_429": 1}, {"http_429": 0}),
    (Flag.BEHIND, {"open_loop": True, "kept_up": False}, {"open_loop": True, "kept_up": True}),
    (Flag.LONG_RAMP, {"steady": True, "ramp_capped": True}, {"steady": True, "ramp_capped": False}),
    # a run saved before steady windows: a first wave that did not all stream ...
    (
        Flag.LONG_RAMP,
        {"steady": False, "concurrency": 4, "first_wave_streamed": 3},
        {"steady": False, "concurrency": 4, "first_wave_streamed": 4},
    ),
    # ... or took more than 20 % of the window
    (
        Flag.LONG_RAMP,
        {
            "steady": False,
            "concurrency": 4,
            "first_wave_streamed": 4,
            "ramp_ns": 21,
            "window_ns": 100,
        },
        {
            "steady": False,
            "concurrency": 4,
            "first_wave_streamed": 4,
            "ramp_ns": 20,
            "window_ns": 100,
        },
    ),
    (Flag.USAGE_MISMATCH, {"usage_below": 1}, {"usage_below": 0, "usage_above": 0}),
    (Flag.USAGE_MISMATCH, {"usage_above": 2}, {}),
    (Flag.WARMUP_UNFINISHED, {"warmup_unfinished": 1}, {"warmup_unfinished": 0}),
    (Flag.COALESCED_DELIVERY, {"coalesced_share": 0.26}, {"coalesced_share": 0.25}),
    # a run whose cells carry no coalesced_share raises no flag
    (Flag.COALESCED_DELIVERY, {"coalesced_share": 0.9}, {"coalesced_share": None}),
    (
        Flag.CACHE_HIT_MISMATCH,
        {"cached_fraction": 0.9, "delivered_cached_fraction": 0.8},
        {"cached_fraction": 0.9, "delivered_cached_fraction": 0.86},
    ),
    # no axis, or a server that reports nothing: no flag
    (Flag.CACHE_HIT_MISMATCH, {"cached_fraction": 0.0, "delivered_cached_fraction": 0.5}, {}),
    (
        Flag.CACHE_HIT_MISMATCH,
        {"cached_fraction": 0.5, "delivered_cached_fraction": 0.2},
        {"cached_fraction": 0.5},
    ),
    # more than half of the reported reasoning never streamed; just under half
    (
        Flag.REASONING_HIDDEN,
        {"reasoning": ((100, 49), (100, 50))},
        {"reasoning": ((100, 50), (100, 50))},
    ),
    (Flag.REASONING_HIDDEN, {"reasoning": ((40, 0),)}, {"reasoning": ((-1, 0),)}),
    # 50 ms at p99 (sessions_late_ms): 50.1 ms flags, 50 ms does not
    (
        Flag.SESSIONS_LATE,
        {"session_send_late_p99_ms": 50.1},
        {"session_send_late_p99_ms": 50.0},
    ),
]


@pytest.mark.parametrize(("flag", "raises", "short"), FLAG_CASES)
def test_each_flag_rule_at_its_edge(flag, raises, short):
    assert flags_of(Evidence(**raises), Rules()) == [flag.value]
    assert flags_of(Evidence(**short), Rules()) == []


def test_every_flag_rule_has_a_table_case():
    assert {f for f, _rule in FLAG_RULES} == {f for f, _r, _s in FLAG_CASES}


def test_open_loop_cells_are_never_long_ramp():
    e = Evidence(open_loop=True, kept_up=True, steady=False, first_wave_streamed=0, concurrency=4)
    assert flags_of(e, Rules()) == []


@pytest.mark.parametrize(
    ("rule", "value", "evidence", "flagged"),
    [
        ("client_bound_cpu_share", 0.5, {"client_cpu_s": 6.0, "cell_s": 10.0}, True),
        ("running_mismatch_slack", 2.0, {"concurrency": 4, "running_mean": 5.0}, False),
        ("ttft_unserved_share", 0.01, {"started": 100, "unserved_longer": 2}, True),
        ("ramp_share", 0.5, {"steady": False, "ramp_ns": 40, "window_ns": 100}, False),
        ("coalesced_share_max", 0.5, {"coalesced_share": 0.4}, False),
        (
            "cache_hit_tolerance",
            0.2,
            {"cached_fraction": 0.9, "delivered_cached_fraction": 0.75},
            False,
        ),
    ],
)
def test_thresholds_come_from_the_rules(rule, value, evidence, flagged):
    assert bool(flags_of(Evidence(**evidence), Rules().replace(**{rule: value}))) is flagged


def test_flags_keep_the_stored_order():
    e = Evidence(idle=False, output_forced=False, stalls=2, usage_below=1, coalesced_share=1.0)
    assert flags_of(e, Rules()) == [
        "busy_at_start",
        "output_not_forced",
        "stalls",
        "usage_mismatch",
        "coalesced_delivery",
    ]


def test_new_rules_are_recorded_like_the_others():
    assert Rules().to_dict()["coalesced_share_max"] == 0.25
    # a run saved before the rule existed reads with its default
    old = {k: v for k, v in Rules().to_dict().items() if k != "coalesced_share_max"}
    assert Rules.from_dict(old) == Rules()


# ---- the status rule ---------------------------------------------------------------------
def _status(**kw):
    args = {
        "errors": {},
        "error_examples": {},
        "started": 100,
        "output_tokens": 1000,
        "server": None,
        "queued_client": 0.0,
    }
    args.update(kw)
    return decode_status(Rules(), **args)


@pytest.mark.parametrize(
    ("kw", "status", "reason_part"),
    [
        ({}, Status.VALID, None),
        ({"errors": {"http_500": 5}}, Status.VALID, None),  # 5 % is not more than 5 %
        (
            {"errors": {"http_500": 6}, "error_examples": {"http_500": "boom"}},
            Status.ERROR,
            "6 of 100 requests failed: http_500 x6 (http_500: boom)",
        ),
        ({"output_tokens": 0}, Status.ERROR, "no output tokens in the window"),
        (
            {"stopped_by": "unreachable", "stop_reason": "5 connects failed"},
            Status.ERROR,
            "5 connects failed",
        ),
        ({"stopped_by": "unreachable"}, Status.ERROR, "the server stopped accepting connections"),
        (
            {"server": {"waiting_held_mean": 0.5, "waiting_max": 3.0}},
            Status.QUEUED,
            "the server kept 0.5 requests waiting on average (up to 3)",
        ),
        (
            {"server": {"waiting_held_mean": 0.4, "waiting_max": 3.0}, "queued_client": 9.0},
            Status.VALID,
            None,
        ),
        # running never reached N and waiting settled at the gap: queued even when no two
        # samples in a row held (short requests against the sampling interval)
        (
            {
                "server": {
                    "waiting_held_mean": 0.375,
                    "running_max": 4.0,
                    "waiting_max": 1.0,
                    "waiting_mean_settled": 0.75,
                },
                "concurrency": 5,
            },
            Status.QUEUED,
            "never ran more than 4 of the 5 requests at once and kept 0.8 waiting",
        ),
        # the same gauges with N within what the server ran: valid
        (
            {
                "server": {
                    "waiting_held_mean": 0.375,
                    "running_max": 5.0,
                    "waiting_max": 1.0,
                    "waiting_mean_settled": 0.75,
                },
                "concurrency": 5,
            },
            Status.VALID,
            None,
        ),
        # running below N but waiting under the gap (a sample between a request's end and
        # the next send reads one fewer running): valid
        (
            {
                "server": {
                    "waiting_held_mean": 0.0,
                    "running_max": 4.0,
                    "waiting_max": 1.0,
                    "waiting_mean_settled": 0.25,
                },
                "concurrency": 5,
            },
            Status.VALID,
            None,
        ),
        # an open loop has no N to compare with: the held rule alone
        (
            {
                "server": {
                    "waiting_held_mean": 0.375,
                    "running_max": 4.0,
                    "waiting_max": 1.0,
                    "waiting_mean_settled": 0.75,
                },
            },
            Status.VALID,
            None,
        ),
        ({"queued_client": 0.6}, Status.QUEUED, "(no server metrics)"),
        ({"queued_client": 0.5}, Status.VALID, None),
        (
            {"server": {"waiting_held_mean": None}, "queued_client": 0.6},
            Status.QUEUED,
            "reports no waiting count",
        ),
    ],
)
def test_status_rule(kw, status, reason_part):
    got, reason = _status(**kw)
    assert got is status
    if reason_part is None:
        assert reason is None
    else:
        assert reason_part in reason


# ---- repetitions and the exit status ----------------------------------------------------
@pytest.mark.parametrize(
    ("statuses", "combined"),
    [
        ([], "valid"),
        ([None, ""], "valid"),
        (["valid", "valid"], "valid"),
        (["valid", "over_capacity", "error"], "over_capacity"),
        (["error", "error"], "error"),
        (["valid", "queued", "error"], "queued"),
        (["valid", "error"], "error"),
    ],
)
def test_one_status_for_repetitions(statuses, combined):
    assert combined_status(statuses) == combined


def test_reported_flags_are_those_of_valid_and_queued_repetitions():
    cells = [
        {"status": "valid", "flags": ["drift"]},
        {"status": "error", "flags": ["stalls"]},
        {"status": "queued", "flags": np.array(["busy_at_start", "drift"])},
        {"status": "valid", "flags": None},
    ]
    assert reported_flags(cells) == ["drift", "busy_at_start"]


def _cell(status, context=256, phase="decode", **kw):
    return {"status": status, "context": context, "phase": phase, **kw}


@pytest.mark.parametrize(
    ("cells", "code"),
    [
        ([], ExitStatus.FAILURE),
        ([_cell("error")], ExitStatus.FAILURE),
        ([_cell("valid"), _cell("queued")], ExitStatus.OK),
        ([_cell("valid"), _cell("over_capacity")], ExitStatus.OK),  # the matrix's edge
        ([_cell("valid"), _cell("error")], ExitStatus.PARTIAL),
        ([_cell("valid"), _cell("valid", not_run=True)], ExitStatus.PARTIAL),
        # a context refused at every concurrency was not measured at all
        ([_cell("valid"), _cell("over_capacity", context=512)], ExitStatus.PARTIAL),
    ],
)
def test_exit_status(cells, code):
    assert exit_status({"cells": cells}) is code


def test_cli_exit_status_is_the_verdicts():
    from speedmatrix import cli
    from speedmatrix.cli import run as cli_run

    doc = {"cells": [_cell("valid"), _cell("error")]}
    assert cli_run.run_exit_status(doc) == cli.EXIT_PARTIAL == ExitStatus.PARTIAL


# ---- open loop: kept up ------------------------------------------------------------------
NAN = float("nan")


@pytest.mark.parametrize(
    ("e2e", "cancelled", "unsent", "ok", "reason_part"),
    [
        ([100.0] * 20, 0, 0, True, ""),
        (
            [100.0] * 20,
            2,
            1,
            False,
            "2 of 20 arrivals were unfinished when the drain bound passed (1 never sent)",
        ),
        ([100.0] * 20, 2, 0, False, "unfinished when the drain bound passed"),
        # latency from the schedule grows 1.6x from the first quarter to the last
        ([100.0] * 15 + [160.0] * 5, 0, 0, False, "grew from a median 0.1 s"),
        ([100.0] * 15 + [150.0] * 5, 0, 0, True, ""),  # 1.5x is not more than 1.5x
        # quarters of 4 arrivals are too few to compare
        ([100.0] * 12 + [900.0] * 4, 0, 0, True, ""),
        # arrivals that did not complete are not in the medians
        ([NAN] * 5 + [100.0] * 10 + [NAN] * 5, 0, 0, True, ""),
    ],
)
def test_kept_up(e2e, cancelled, unsent, ok, reason_part):
    got, reason = kept_up(np.array(e2e), cancelled, unsent)
    assert got is ok
    assert reason_part in reason and (reason == "") is ok


# ---- what the records say ---------------------------------------------------------------
def test_usage_mismatches_counts_the_decoders_judgements():
    # token_source: 1 chunks, 2 final usage, 3 continuous, 4 usage below chunks, 5 far above
    assert usage_mismatches(np.array([1, 2, 3, 4, 4, 5], np.uint8)) == (2, 1)
    assert usage_mismatches(np.array([2, 3], np.uint8)) == (0, 0)


@pytest.mark.parametrize(
    ("phase", "body", "outcome", "unfinished"),
    [
        ([1, 1], [0, 1], [1, 1], 0),  # no warm-up
        ([0, 0, 1], [0, 1, 0], [1, 1, 1], 0),
        # body 1 timed out (cancelled) and its second try completed
        ([0, 0, 0, 1], [0, 1, 1, 0], [1, 2, 1, 1], 0),
        # body 1 failed on both tries
        ([0, 0, 0, 1], [0, 1, 1, 0], [1, 3, 2, 1], 1),
        ([0, 0, 1], [0, 1, 0], [3, 2, 1], 2),
    ],
)
def test_warmup_unfinished(phase, body, outcome, unfinished):
    req = {"phase": np.array(phase), "body": np.array(body), "outcome": np.array(outcome)}
    assert warmup_unfinished(req) == unfinished


# ---- names ------------------------------------------------------------------------------
def test_statuses_and_flags_are_the_stored_strings():
    assert tuple(s.value for s in Status) == runfile.STATUSES
    assert REPORTED == ("valid", "queued")
    assert json.dumps([Status.QUEUED, Flag.DRIFT]) == '["queued", "drift"]'
    assert Status.VALID == "valid" and Flag.USAGE_MISMATCH == "usage_mismatch"
    for f in Flag:
        assert f.short and f.text.startswith(f.short.split()[0])


def test_every_flag_rule_is_in_the_docs_flag_table():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    table = doc[doc.index("## Flags") :]
    for flag, _rule in FLAG_RULES:
        assert f"| `{flag.value}` |" in table, flag


@pytest.mark.parametrize(
    ("cells", "kind"),
    [
        ([{"not_run": True, "errors_total": 3, "measured_s": 2.0}], "not_run"),
        ([{"not_run": float("nan"), "errors_total": 3, "measured_s": 2.0}], "failed"),
        ([{"errors_total": 3, "measured_s": 0.0}], "unmeasured"),  # nothing ran
        ([{"errors_total": 0, "measured_s": 2.0}], "unmeasured"),  # no output, no failure
        ([{"errors_total": float("nan"), "measured_s": 2.0}], "unmeasured"),
        (
            [{"errors_total": None, "measured_s": None}, {"errors_total": 1, "measured_s": 1.5}],
            "failed",
        ),
        ([], "unmeasured"),
    ],
)
def test_why_a_cell_is_an_error(cells, kind):
    assert error_kind(cells) == kind


def test_why_a_cell_is_an_error_from_a_data_frame_row():
    import pandas as pd

    row = {"not_run": pd.NA, "errors_total": 2, "measured_s": 1.0}
    assert error_kind([row]) == "failed"


# ---- the window's first wave and the client's view of queuing (times in ms) -------------
MS = 1_000_000


def _req(sent, first, done, phase=None):
    n = len(sent)
    return {
        "phase": np.array(phase or [1] * n),
        "sent_ns": np.array(sent, np.int64) * MS,
        "first_token_ns": np.array([f * MS if f >= 0 else -1 for f in first], np.int64),
        "done_ns": np.array([d * MS if d >= 0 else -1 for d in done], np.int64),
    }


@pytest.mark.parametrize(
    ("first", "n", "settled_ms", "streamed"),
    [
        ([10, 30, 20], 3, 30, 3),  # the last first token of the wave
        ([10, -1, 20], 3, 20, 2),  # one never streamed: the latest that did
        ([-1, -1, -1], 3, 1000, 0),  # none: the window's end
        ([10, 30, 20], 2, 30, 2),  # only the first N rows count
        ([-5, 2, 3], 3, 5, 2),  # never before t0 (a first token before the window opened)
    ],
)
def test_first_wave(first, n, settled_ms, streamed):
    req = _req([0, 0, 0], first, [-1, -1, -1])
    assert first_wave_settled(req, n, 5 * MS, 1000 * MS) == settled_ms * MS
    assert first_wave_streamed(req, n) == streamed


@pytest.mark.parametrize(
    ("first", "done", "start", "mean"),
    [
        ([100, 100], [-1, -1], 100, 0.0),  # both streamed at once
        ([100, 600], [-1, -1], 100, 0.5),  # one waited half the span
        ([100, -1], [-1, -1], 100, 1.0),  # one never streamed
        ([100, -1], [-1, 350], 100, 0.25),  # ... and ended (failed) at 350 ms
        ([100, 600], [-1, -1], 600, 0.0),  # judged from 600 ms: no wait left
    ],
)
def test_client_queue_signal(first, done, start, mean):
    # two window requests sent at 100 ms, judged until 1100 ms
    req = _req([100, 100], first, done)
    assert client_queue_signal(req, start * MS, 1100 * MS) == pytest.approx(mean)
    assert client_queue_signal(_req([], [], []), start * MS, 1100 * MS) == 0.0
