"""`speedmatrix run` as a user runs it: against the built-in engine, interrupted
with Ctrl-C and resumed, with secrets that must never reach a file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from speedmatrix.sim import Sim

CLI = [sys.executable, "-m", "speedmatrix.cli"]


@pytest.fixture(scope="module")
def sim():
    with Sim("fixed") as s:
        yield s


def _cells(out: Path) -> dict:
    try:
        doc = json.loads((out / "run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {c["id"]: c for c in doc["cells"]}


def test_ctrl_c_keeps_finished_cells_and_resume_completes_the_run(sim, tmp_path):
    out = tmp_path / "run"
    args = CLI + ["run", "--url", sim.url, "--contexts", "64,128,256", "--concurrency", "1,2",
                  "--duration", "1s", "--max-output", "500", "--out", str(out), "--quiet"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_cells(out)) < 2:
        time.sleep(0.05)
    assert len(_cells(out)) >= 2, proc.stderr.read() if proc.poll() is not None else "slow"
    time.sleep(0.3)  # inside the next cell
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "--resume" in err
    doc = json.loads((out / "run.json").read_text())
    assert doc["meta"]["run"]["interrupted"] is True
    before = _cells(out)
    assert 2 <= len(before) < 6
    assert all(c["status"] == "valid" for c in before.values())
    assert (out / "report.md").is_file()  # a report of what was measured

    res = subprocess.run(CLI + ["run", "--resume", str(out), "--quiet"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    after = _cells(out)
    assert len(after) == 6
    for cid, cell in before.items():  # finished cells were not measured again
        assert after[cid]["t0_ns"] == cell["t0_ns"]
    assert json.loads((out / "run.json").read_text())["meta"]["run"]["interrupted"] is False


def test_secrets_never_reach_a_file(sim, tmp_path):
    from secrets_check import secrets_found  # opens records/*.npz and decodes their strings

    out = tmp_path / "run"
    key = "sk-test-SECRETKEY-1234567890"
    launch_key = "hunter2-LAUNCHSECRET"
    admin_key = "adminKEY-LAUNCHSECRET"
    hf = "hf_TOKENSECRETabcdef"
    launch = (f"HF_TOKEN={hf} python -m sglang.launch_server --model-path m --api-key "
              f"{launch_key} --admin-api-key={admin_key} --port 8000")
    res = subprocess.run(CLI + ["run", "--url", sim.url, "--api-key", key, "--contexts", "64",
                                "--concurrency", "1", "--duration", "1s", "--max-output", "100",
                                "--launch-command", launch, "--out", str(out), "--quiet"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"run.json", "report.md", "report.html"} <= {p.name for p in files}
    assert any(p.suffix == ".npz" for p in files)
    assert secrets_found(out, [key, launch_key, admin_key, hf]) == []
    for text in (res.stdout, res.stderr):
        assert key not in text and launch_key not in text and admin_key not in text
    doc = json.loads((out / "run.json").read_text())
    assert "<redacted>" in doc["meta"]["run"]["launch_command"]
    assert "--model-path m" in doc["meta"]["run"]["launch_command"]
