"""Hostile round three, the smaller items (issue 25): bounded messages, a stalled
calibration, silent waits before a cell, temp files left by kill -9, warnings, a run that
measured nothing, and the hostile inputs that ended in `internal error`."""

from __future__ import annotations

import json

import pytest
from cliproc import run_cli
from speedmatrix.adapters import ModelNotServedError, discover
from speedmatrix.errors import clip, some_of
from speedmatrix.http import ConnectError
from test_hostile import RawServer, _answer

MANY = [f"org-{i:05d}/model-with-a-long-name-{i:05d}" for i in range(10_000)]


def _models_server(names: list[str]) -> RawServer:
    body = json.dumps({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

    def handler(conn, request):
        if request.startswith(b"GET /v1/models"):
            conn.sendall(_answer("200 OK", body.encode(), {"Content-Type": "application/json"}))
        else:
            conn.sendall(_answer("404 Not Found", b'{"error": "no"}'))

    return RawServer(handler)


def test_clip_and_some_of_bound_text_from_outside():
    assert clip("a\n b\t c") == "a b c"
    long = clip("x" * 5000, 100)
    assert long.startswith("x" * 100) and long.endswith("(4,900 characters more)")
    assert some_of(["a", "b"]) == "a, b"
    text = some_of(MANY)
    assert len(text) < 400 and text.endswith("and 9,990 more")


def test_ten_thousand_model_names_are_not_echoed_whole(tmp_path):
    srv = _models_server(MANY)
    try:
        with pytest.raises(ModelNotServedError) as err:
            discover(srv.url, model="nope", timeout_s=5)
        msg = str(err.value)
        assert len(msg) < 500 and "and 9,990 more" in msg and "\n" not in msg
        target = discover(srv.url, timeout_s=5)  # several models: the warning is bounded too
        (warning,) = [w for w in target.warnings if "several models" in w]
        assert len(warning) < 500 and "and 9,990 more" in warning
        res = run_cli(
            "run", "--url", srv.url, "--model", "x" * 20_000, "--out", str(tmp_path / "run")
        )
        assert res.returncode == 1 and res.stderr.count("\n") == 1
        assert len(res.stderr) < 2_200, len(res.stderr)
    finally:
        srv.close()


def test_a_stalled_calibration_is_bounded_and_said(monkeypatch):
    import time

    from speedmatrix import prompts
    from speedmatrix.adapters.base import Target

    def handler(conn, request):
        if request.startswith(b"POST"):
            time.sleep(3)  # takes the request, never answers in time

    srv = RawServer(handler)
    monkeypatch.setattr(prompts, "CALIBRATION_TIMEOUT_S", 0.5)
    try:
        factory = prompts.PromptFactory(Target(url=srv.url, model="m"), 256)
        start = time.monotonic()
        with pytest.raises(prompts.PromptError) as err:
            factory.prompts(1)
        assert time.monotonic() - start < 2.5
        msg = str(err.value)
        assert "calibration" in msg and "got no answer within 0.5 s" in msg and "stalled" in msg
        assert "cannot reach" not in msg
    finally:
        srv.close()


class _Gauges:
    """A target whose /metrics reads ``load`` (or raises it)."""

    def __init__(self, load):
        self.load = load
        self.metrics_url = "http://127.0.0.1:1/metrics"
        self.metrics = type("M", (), {"path": "/metrics"})()

    def client(self, timeout_s):
        return None

    def read_load(self, client):
        if isinstance(self.load, Exception):
            raise self.load
        return {"running": self.load[0], "waiting": self.load[1]}


def _waiter(load, idle_timeout_s=1.0):
    import types

    from speedmatrix import sweep

    said: list[str] = []
    fake = types.SimpleNamespace(
        target=_Gauges(load),
        matrix=types.SimpleNamespace(idle_timeout_s=idle_timeout_s),
        progress=types.SimpleNamespace(message=said.append),
        _cell_notes=[],
        _stuck_load=None,
    )
    fake._note = lambda text: sweep.Sweep._note(fake, text)

    def wait():
        import time

        start = time.monotonic()
        idle, _ = sweep.Sweep._wait_idle(fake)
        return idle, time.monotonic() - start, list(fake._cell_notes)

    return wait, said


@pytest.mark.parametrize(
    ("load", "words"),
    [
        ((float("nan"), 0.0), "running nan"),
        (
            ConnectError("http://x/metrics", "no answer within 2 s"),
            "did not answer",
        ),
    ],
)
def test_metrics_that_cannot_tell_the_load_are_said_at_once(load, words):
    wait, said = _waiter(load, idle_timeout_s=30)
    idle, took, notes = wait()
    assert idle and took < 1.0
    assert len(notes) == 1 and words in notes[0] and "unknown" in notes[0]
    assert said == [f"speedmatrix: note: {notes[0]}"]


def test_a_gauge_that_never_reads_zero_is_said_and_not_waited_for_every_cell(monkeypatch):
    from speedmatrix.sweep import server

    monkeypatch.setattr(server, "IDLE_SAY_AFTER_S", 0.3)  # read where the idle wait lives
    wait, said = _waiter((3.0, 0.0), idle_timeout_s=1.2)
    idle, took, notes = wait()
    assert not idle and 1.2 <= took < 2.5
    assert any("waiting up to 1.2 s for the server to be idle (running 3.0" in s for s in said)
    assert len(notes) == 1 and "did not report idle" in notes[0] and "stuck gauge" in notes[0]
    idle, took, notes = wait()  # the same stuck reading before the next cell: a short wait
    assert not idle and took < 0.9
    assert "again" in notes[0]


@pytest.mark.e2e
def test_a_run_that_measured_nothing_says_why(tmp_path):
    from speedmatrix.sim import Sim

    with Sim("fixed", faults={"http500": 1.0}, seed=1) as sim:
        res = run_cli(
            "run",
            "--url",
            sim.url,
            "--contexts",
            "64",
            "--concurrency",
            "1",
            "--duration",
            "1s",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--no-report",
            timeout=120,
        )
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("speedmatrix: error:")]
    assert len(lines) == 1, res.stderr
    assert "no cell was measured" in lines[0] and "failed" in lines[0], lines[0]


def test_python_warnings_are_one_line_without_package_paths():
    import subprocess
    import sys

    # a command that meets a library warning (numpy's, as a report of an empty run would)
    code = (
        "import sys, warnings\n"
        "import numpy as np\n"
        "from speedmatrix import cli\n"
        "def cmd(args):\n"
        "    np.mean(np.zeros(0)); np.mean(np.zeros(0))\n"
        "    warnings.warn('old thing', DeprecationWarning)\n"
        "    return 0\n"
        "cli.COMMANDS['init'] = cmd\n"
        "sys.exit(cli.main(['init', 'x']))\n"
    )
    res = subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    # one line a warning, each once (the mean of an empty slice warns twice, said once)
    assert len(lines) == 3, res.stderr
    assert all(ln.startswith("speedmatrix: warning: ") for ln in lines), res.stderr
    assert ".py" not in res.stderr and "site-packages" not in res.stderr
    assert "Mean of empty slice" in lines[0] and lines[0].endswith("(RuntimeWarning)")
    assert lines[2] == "speedmatrix: warning: old thing (DeprecationWarning)"


@pytest.fixture(scope="module")
def saved_run(fixed_sim, tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "run"
    res = run_cli(
        "run",
        "--url",
        fixed_sim.url,
        "--contexts",
        "64",
        "--concurrency",
        "1,2",
        "--duration",
        "1s",
        "--out",
        str(out),
        "--quiet",
        "--no-report",
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return out


# hand-edited run.json fields a mutation fuzzer of report/recompute found (each was an
# `internal error` line): now the schema's one line, naming the field
EDITS = [
    ("cells.0.prompt_tok_s", {}),
    ("cells.1.latency", "x"),
    ("cells.1.latency.tbt_ms.ci.p99", 5),
    ("cells.1.latency.percentiles", ["x"]),
    ("cells.1.ci.tbt_ms", 1.5),
    ("cells.1.ramp_start_ns", []),
    ("cells.1.decode_tok_s_per_request", []),
    ("cells.1.prompt_tokens.reported_max", []),
    ("cells.1.context", 2**70),
    ("cells.1.repetition", 2**70),
    ("meta.engine.model_path", 5),
    ("meta.verdict.rules.ttft_unserved_share", {}),
    ("meta.capacity.kv_tokens.value", 0),
    ("meta.target.model_name_source", []),
    ("meta.run.plan", "x"),
    ("meta.run.plan.contexts", [[1]]),
    ("meta.run.matrix.request_rates", 5),
    ("meta.hardware.sources.type", []),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("where", "value"), EDITS)
def test_a_hand_edited_run_is_one_line_not_an_internal_error(saved_run, tmp_path, where, value):
    import contextlib
    import io
    import shutil

    from speedmatrix import cli

    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    doc = json.loads((run / "run.json").read_text())
    *path, last = [int(p) if p.isdigit() else p for p in where.split(".")]
    node = doc
    for p in path:
        node = node[p]
    node[last] = value
    (run / "run.json").write_text(json.dumps(doc))
    for cmd in (["report", str(run)], ["recompute", str(run)]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(cmd)
        text = err.getvalue()
        assert code == 1 and text.count("\n") == 1, (cmd, text)
        assert "internal error" not in text and "does not follow speedmatrix.run/1" in text, text


def test_a_gzip_encoded_stream_is_named_in_its_error():
    import gzip

    import numpy as np
    from speedmatrix._native import _core

    events = b"".join(
        b'data: {"choices": [{"index": 0, "text": "x", "finish_reason": null}]}\n\n'
        for _ in range(4)
    )
    body = gzip.compress(events + b"data: [DONE]\n\n")

    def handler(conn, request):
        head = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
        conn.sendall(_answer("200 OK", body, head))

    srv = RawServer(handler)
    try:
        spec = _core.CellSpec()
        spec.url = srv.url + "/v1/completions"
        spec.bodies = [b'{"prompt": "hi", "max_tokens": 4, "stream": true}']
        spec.concurrency = 1
        spec.duration_s = 0.3
        spec.connect_timeout_s = 5
        spec.idle_timeout_s = 5
        res = _core.CellRunner(spec).run()
    finally:
        srv.close()
    req = res.requests
    failed = np.asarray(req["outcome"]) == 3
    assert failed.any()
    kinds = set(np.asarray(req["error_kind"])[failed].tolist())
    msgs = set(np.asarray(req["error_message"])[failed].tolist())
    assert kinds == {"not_sse"}, kinds
    assert all("gzip-encoded (Content-Encoding: gzip)" in m for m in msgs), msgs
