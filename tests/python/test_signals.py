"""Signals and exit codes end to end (issue 14, marker e2e: a real-time engine): SIGTERM and
SIGHUP stop a run as Ctrl-C does, a second signal exits at once with run.json whole, a run
that measured nothing exits 1, `speedmatrix sim` never leaves its engine behind, and the
built-in engine's own guards (--api-key, max_tokens overflow)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cliproc import CLI, run_cells
from cliproc import free_port as _free_port
from speedmatrix import cli
from speedmatrix.sim import Sim

pytestmark = pytest.mark.e2e


def _start_run(url: str, out: Path, report: bool = False) -> subprocess.Popen:
    args = (
        CLI
        + [
            "run",
            "--url",
            url,
            "--contexts",
            "64,128,256",
            "--concurrency",
            "1,2",
            "--duration",
            "2s",
            "--max-output",
            "500",
            "--out",
            str(out),
            "--quiet",
        ]
        + ([] if report else ["--no-report"])
    )
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(run_cells(out)) < 1:
        time.sleep(0.05)
    assert run_cells(out), proc.stderr.read() if proc.poll() is not None else "slow"
    time.sleep(0.5)  # inside the next cell
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does(fixed_sim, tmp_path, sig):
    out = tmp_path / "run"
    proc = _start_run(fixed_sim.url, out)
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    took_s = time.monotonic() - t0
    assert proc.returncode == 128 + sig, err
    assert "--resume" in err
    assert json.loads((out / "run.json").read_text())["meta"]["run"]["interrupted"] is True
    print(f"stopped by {sig!r} in {took_s:.2f} s")  # figure for docs/RELIABILITY.md
    assert took_s < 5, f"stopped in {took_s:.1f} s"


def test_a_second_signal_exits_at_once_and_run_json_stays_whole(fixed_sim, tmp_path):
    out = tmp_path / "run"
    proc = _start_run(
        fixed_sim.url, out, report=True
    )  # the report's charts: a stop that takes time
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 2
    assert proc.returncode == 143, err
    assert "second signal" in err
    json.loads((out / "run.json").read_text())  # whole: every write is atomic


def test_a_run_that_measured_nothing_exits_1(tmp_path):
    with Sim("fixed", faults={"http500": 1.0}) as broken:
        res = subprocess.run(
            CLI
            + ["run", "--url", broken.url, "--contexts", "64", "--concurrency", "1"]
            + ["--duration", "1s", "--max-output", "50", "--out", str(tmp_path / "o")]
            + ["--quiet", "--no-report"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert res.returncode == cli.EXIT_FAILURE, res.stderr
    assert {c["status"] for c in run_cells(tmp_path / "o")} == {"error"}


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP])
def test_speedmatrix_sim_takes_its_engine_down(sig):
    port = _free_port()
    proc = subprocess.Popen(
        CLI + ["sim", "--profile", "fixed", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _port_free(port):
            time.sleep(0.05)
        assert not _port_free(port), "the engine did not start"
        proc.send_signal(sig)
        proc.wait(10)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not _port_free(port):
            time.sleep(0.05)
        assert _port_free(port), f"the engine outlived `speedmatrix sim` ({sig!r})"
    finally:
        if proc.poll() is None:
            proc.kill()


def _post(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_the_built_in_engine_can_require_a_key():
    key = "sk-sim-key-0123456789"
    with Sim("fixed", api_key=key) as s:
        body = {"model": "x", "prompt": "hello", "max_tokens": 2}
        assert _post(s.url + "/v1/completions", body)[0] == 401
        assert _post(s.url + "/v1/completions", body, "wrong-key-0000")[0] == 401
        assert _post(s.url + "/v1/completions", {**body, "model": "sim-fixed"}, key)[0] == 200
        with urllib.request.urlopen(s.url + "/health", timeout=5) as r:  # left open, as vLLM's
            assert r.status == 200
        with open(f"/proc/{s._proc.pid}/cmdline", "rb") as f:
            assert key.encode() not in f.read()  # the key is not on its command line


def test_max_tokens_near_2_to_63_is_refused(fixed_sim):
    model = "sim-fixed"
    for n in (2**63 - 10, 2**62):
        code, body = _post(
            fixed_sim.url + "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": n}
        )
        assert code == 400, body
    assert fixed_sim.state()["running"] == 0
