"""The running cap vLLM does not publish, and what the capacity rule does without it, as
tables on synthetic targets: block rounding, launch-command flags, the load probe's
reading, cells left to the measurement, preemptions in a cell's verdict."""

import dataclasses

import numpy as np
import pytest
from speedmatrix.adapters import Target
from speedmatrix.adapters.llamacpp import LAYOUT_UNKNOWN
from speedmatrix.adapters.running import (
    Plateau,
    learn_max_running,
    max_running_from_launch,
    read_plateau,
)
from speedmatrix.adapters.types import MetricsSpec
from speedmatrix.capacity import model_for
from speedmatrix.matrix import Matrix
from speedmatrix.plan import plan
from speedmatrix.verdict.preemption import apply_preemptions, preemptions_in, waited_for_kv


def vllm_target(kv=4096, block=128, running=None, preemptions=True, at_least=None) -> Target:
    t = Target("http://h:1", engine="vllm", model="m")
    t.set_capacity("kv_tokens", kv, "probed", "cache_config_info")
    t.set_capacity("context_length", 2048, "probed", "/v1/models")
    if running:
        t.set_capacity("max_running", running, "given", "t")
    t.info["kv_block_tokens"] = block
    if at_least:
        t.info["max_running_at_least"] = at_least
    t.metrics = MetricsSpec(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        preemptions="vllm:num_preemptions_total" if preemptions else None,
        available=True,
    )
    return t


# (context, N, output) -> status, queued, judged: vLLM, 32 blocks of 128 tokens, 4 running
BLOCKS = [
    ((256, 6, 48), None, True, ""),  # min(6, 4) × 3 blocks = 12 fits; N > 4 queues
    ((1280, 2, 48), None, False, ""),  # 1328 → 11 blocks; 2 × 11 = 22
    # 3 × 1328 = 3984 tokens would fit, but 3 × 11 blocks = 33 > 32: rounding decides
    ((1280, 3, 48), "over_capacity", False, ""),
    ((896, 4, 128), None, False, ""),  # 1024 = 8 blocks exactly; 4 × 8 = 32 fits
    ((896, 4, 129), "over_capacity", False, ""),  # one token more: 9 blocks each
    ((1280, 6, 48), "over_capacity", True, ""),
]


@pytest.mark.parametrize(("cell", "status", "queued", "judged"), BLOCKS)
def test_vllm_rule_rounds_requests_up_to_blocks(cell, status, queued, judged):
    fit = model_for(vllm_target(running=4)).check(*cell)
    assert (fit.status, fit.queued, fit.judged) == (status, queued, judged), fit.reason
    if status:
        assert "blocks of 128" in fit.reason


def test_unknown_running_is_measured_not_refused():
    model = model_for(vllm_target())
    assert model.measure_unknown_running
    assert model.check(256, 6, 48).judged == ""
    fit = model.check(1280, 3, 48)
    assert (fit.status, fit.judged) == (None, "measured")
    assert "max running unknown" in fit.reason
    # one request larger than the whole pool is over capacity whatever runs at once
    assert model_for(vllm_target(kv=1024)).check(1000, 2, 48).status == "over_capacity"
    # without a preemption counter nothing can be measured: N is assumed (as before)
    assert model_for(vllm_target(preemptions=False)).check(1280, 3, 48).status == ("over_capacity")
    # a probe that saw 8 run at once: N below that run, the rule decides
    assert model_for(vllm_target(at_least=8)).check(1280, 3, 48).status == "over_capacity"
    assert "measure_unknown_running" in model.to_dict()


def test_plan_marks_measured_cells():
    m = Matrix(contexts=[256, 1280], concurrency=[2, 3], max_output=48, prefill_contexts=[])
    p = plan(m, vllm_target())
    checks = {(c.context, c.concurrency): c.capacity_check for c in p if c.phase == "decode"}
    assert checks == {(256, 2): "", (256, 3): "", (1280, 2): "", (1280, 3): "measured"}
    assert all(c.runnable for c in p)


LAUNCH = [
    ("vllm", "python -m vllm.entrypoints.openai.api_server --model m --max-num-seqs 4", 4),
    ("vllm", "vllm serve m --max-num-seqs=12 --max-model-len 2048", 12),
    ("vllm", "vllm serve m --max-num-seqs 4 --max-num-seqs 6", 6),  # the last one wins
    ("vllm", "vllm serve m --max-model-len 2048", None),
    ("vllm", "vllm serve m --max-num-seqs", None),
    ("vllm", "vllm serve m --max-num-seqs abc", None),
    ("sglang", "python -m sglang.launch_server --max-running-requests 64", 64),
    ("llamacpp", "llama-server -m x.gguf -np 4 -c 8192", 4),
    ("llamacpp", "llama-server -m x.gguf --parallel=2", 2),
    ("vllm", "llama-server -np 4", None),  # another engine's flag says nothing
    ("vllm", "vllm serve 'unterminated --max-num-seqs 3", 3),
    ("vllm", None, None),
]


@pytest.mark.parametrize(("engine", "command", "expected"), LAUNCH)
def test_max_running_from_launch(engine, command, expected):
    assert max_running_from_launch(engine, command)[0] == expected


def test_launch_command_fills_max_running_as_given():
    t = vllm_target()
    assert learn_max_running(t, "vllm serve m --max-num-seqs 3") is None
    cap = t.capacity["max_running"]
    assert (cap.value, cap.source, cap.detail) == (3, "given", "launch command --max-num-seqs 3")
    # a figure the user gave is never replaced
    t2 = vllm_target(running=5)
    learn_max_running(t2, "vllm serve m --max-num-seqs 3")
    assert t2.max_running == 5


# (running, waiting, kv_usage) samples of a probe of `sent` requests -> cap, at_least
PLATEAUS = [
    ([(2, 3, 0.1), (4, 1, 0.2), (4, 1, 0.3), (4, 1, 0.3), (1, 0, 0.1)], 5, 4, None),
    ([(5, 0, 0.1), (5, 0, 0.2), (3, 0, 0.1)], 5, None, 5),  # all ran: at least 5
    ([(4, 1, 1.0), (4, 1, 1.0)], 5, None, None),  # a full cache keeps them waiting
    ([(4, 1, 0.2), (3, 0, 0.2)], 5, None, None),  # waiting seen once: not a plateau
    ([(2, 3, 0.1), (3, 2, 0.1)], 5, None, None),  # still rising
    ([], 5, None, None),
]


@pytest.mark.parametrize(("samples", "sent", "cap", "at_least"), PLATEAUS)
def test_read_plateau(samples, sent, cap, at_least):
    got = read_plateau(samples, sent)
    assert isinstance(got, Plateau)
    assert (got.cap, got.at_least) == (cap, at_least), got.detail


# readings of the probe's tries -> output tokens the tries asked for, cap, at_least
RETRIES = [
    ([(None, None, 3)], (96, 384), None, None),  # no plateau: taken again, longer
    ([(None, None, 3), (4, None, 4)], (96, 384), 4, None),  # the longer try proves it
    ([(4, None, 4)], (96,), 4, None),  # proved at once: no second try
    ([(None, 7, 7)], (96,), None, 7),  # all ran at once: no second try
    ([(None, None, None)], (96,), None, None),  # no samples at all: nothing to gain
]


@pytest.mark.parametrize(("tries", "asked", "cap", "at_least"), RETRIES)
def test_probe_retries_an_inconclusive_reading_once_with_longer_requests(
    monkeypatch, tries, asked, cap, at_least
):
    from speedmatrix.adapters import running

    readings = [Plateau(c, a, "read", p) for c, a, p in tries]
    readings += [readings[-1]] * 2
    seen = []

    def once(target, requests, output_tokens, deadline):
        seen.append(output_tokens)
        return readings[len(seen) - 1]

    monkeypatch.setattr(running, "_probe_once", once)
    t = vllm_target()
    t.metrics = dataclasses.replace(t.metrics, path="/metrics")
    got = running.probe_max_running(t, 7)
    assert tuple(seen) == asked
    assert (got.cap, got.at_least) == (cap, at_least)
    assert ("tries:" in got.detail) is (len(asked) > 1)


def _metrics(counter):
    names = ["vllm:num_requests_running", "vllm:num_preemptions_total"]
    values = [[1.0, c] for c in counter]
    return {"names": names, "t_ns": np.arange(len(counter)), "values": np.array(values).ravel()}


PREEMPTIONS = [
    ([3.0, 3.0, 3.0], 0),
    ([3.0, 5.0, 7.0], 4),
    ([3.0, 5.0, 1.0, 2.0], 4),  # reset to 1 (restarted): 2 + 1 + 1
    ([float("nan"), 2.0, 2.0], 0),
]


@pytest.mark.parametrize(("counter", "expected"), PREEMPTIONS)
def test_preemptions_in(counter, expected):
    assert preemptions_in(_metrics(counter), "vllm:num_preemptions_total") == expected


def test_preemptions_not_sampled():
    assert preemptions_in(_metrics([1.0]), None) is None
    assert preemptions_in(_metrics([1.0]), "other") is None


# (status before, preemptions, capacity_check) -> status, flagged, decided_by starts
VERDICTS = [
    ("valid", 0, "", "valid", False, None),
    ("valid", 3, "", "valid", True, None),  # the rule decided: flagged, status kept
    ("queued", 0, "measured", "queued", False, "measurement: no preemptions"),
    ("queued", 2, "measured", "over_capacity", True, "measurement: 2 preemptions"),
    ("valid", 1, "measured", "over_capacity", True, "measurement: 1 preemptions"),
    ("error", 2, "measured", "error", True, "measurement: 2 preemptions (cell failed)"),
    ("valid", None, "measured", "valid", False, "measurement, inconclusive"),
]


@pytest.mark.parametrize(("before", "count", "check", "status", "flagged", "decided"), VERDICTS)
def test_apply_preemptions(before, count, check, status, flagged, decided):
    cell = {"status": before, "flags": [], "server": {"running_mean": 1.0}}
    apply_preemptions(cell, count, check, kv_wait=False)
    assert cell["status"] == status
    assert ("preempted" in cell["flags"]) is flagged
    if count is not None:
        assert cell["server"]["preemptions"] == count
    if decided is None:
        assert "capacity_decided_by" not in cell
    else:
        assert cell["capacity_decided_by"].startswith(decided)
    if status == "over_capacity":
        assert "preempted" in cell["reason"] and "decided by measurement" in cell["reason"]


class _Facts:
    metric_waiting = "w"
    metric_kv_usage = "kv"


def _kv_metrics(waiting, usage):
    values = np.array([[w, u] for w, u in zip(waiting, usage, strict=True)]).ravel()
    return {"names": ["w", "kv"], "t_ns": np.arange(len(waiting)), "values": values}


# (waiting, kv usage) samples, the prompt's share of the pool -> waited for KV
KV_WAITS = [
    ([1, 1, 1], [0.75, 0.75, 0.75], 8 / 24, True),  # 6 free blocks of 24 < 8 a prompt needs
    ([1, 1, 1], [0.5, 0.5, 0.5], 8 / 24, False),  # 12 free: waiting for a running slot
    ([0, 1, 0], [0.9, 0.9, 0.9], 8 / 24, False),  # waited in one sample only
    ([1, 1], [0.75, 0.75], 0.0, None),  # no share known
]


@pytest.mark.parametrize(("waiting", "usage", "share", "expected"), KV_WAITS)
def test_waited_for_kv(waiting, usage, share, expected):
    assert waited_for_kv(_kv_metrics(waiting, usage), _Facts(), share) is expected


def test_a_measured_cell_that_waited_for_kv_is_over_capacity():
    cell = {"status": "queued", "flags": [], "server": {}}
    apply_preemptions(cell, 0, "measured", kv_wait=True)
    assert cell["status"] == "over_capacity"
    assert cell["capacity_decided_by"] == "measurement: requests waited for KV blocks"
    assert "give --max-running" in cell["reason"]
    # the rule decided the cell: the wait is the queue's, not a verdict on capacity
    ruled = {"status": "queued", "flags": [], "server": {}}
    apply_preemptions(ruled, 0, "", kv_wait=True)
    assert ruled["status"] == "queued"


def test_plan_gives_measured_cells_the_prompt_share():
    m = Matrix(contexts=[1280], concurrency=[3], max_output=48, prefill_contexts=[])
    (cell,) = plan(m, vllm_target())
    assert cell.kv_admit_share == pytest.approx(1280 / 4096)


LAYOUTS = [
    ("llama-server -m m.gguf -np 2 -c 12288 --kv-unified", True),
    ("llama-server -m m.gguf -np 2 -c 12288 -kvu", True),
    ("llama-server -m m.gguf --parallel 4 -c 8192", False),
    ("llama-server -m m.gguf --parallel=4 -c 8192", False),
    ("llama-server -m m.gguf -np 4 --no-kv-unified", False),
    ("llama-server -m m.gguf -np 4 -kvu -no-kvu", False),  # the last one wins
    ("llama-server -m m.gguf -c 8192", None),  # auto slots: the server's default
    ("llama-server -m m.gguf -np 1", None),
    (None, None),
]


@pytest.mark.parametrize(("command", "unified"), LAYOUTS)
def test_llamacpp_layout_from_launch(command, unified):
    from speedmatrix.adapters.llamacpp import layout_from_launch

    got = layout_from_launch(command)
    assert (got or {}).get("unified") == unified


def _llamacpp_unknown() -> Target:
    t = Target("http://h:1", engine="llamacpp", model="m")
    t.set_capacity("context_length", 6144, "probed", "/props n_ctx")
    t.set_capacity("max_running", 2, "probed", "/props total_slots")
    t.info["kv_layout"] = {"unified": None, "source": "unknown"}
    t.warnings.append(LAYOUT_UNKNOWN)
    return t


def test_llamacpp_unknown_layout_settled_by_the_launch_command():
    from speedmatrix.adapters.running import learn_layout

    m = Matrix(contexts=[3072], concurrency=[1, 2], max_output=64, prefill_contexts=[])
    # unknown: no pool claimed, only the slot rule (the server's refusal judges the pool)
    statuses = [c.status for c in plan(m, _llamacpp_unknown())]
    assert statuses == [None, None]
    split = _llamacpp_unknown()
    learn_layout(split, "llama-server -np 2 -c 12288")
    assert split.info["kv_layout"]["unified"] is False and split.kv_tokens == 12288
    assert LAYOUT_UNKNOWN not in split.warnings, "settled: the warning is withdrawn"
    open_still = _llamacpp_unknown()
    learn_layout(open_still, "llama-server -c 12288")
    assert LAYOUT_UNKNOWN in open_still.warnings
    assert [c.status for c in plan(m, split)] == [None, None]
    unified = _llamacpp_unknown()
    learn_layout(unified, "llama-server -np 2 -c 6144 --kv-unified")
    assert unified.info["kv_layout"] == {
        "unified": True,
        "source": "given: launch command --kv-unified",
    }
    assert [c.status for c in plan(m, unified)] == [None, "over_capacity"]
