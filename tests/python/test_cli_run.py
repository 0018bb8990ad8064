"""`speedmatrix run` as a user runs it: against the built-in engine, interrupted
with Ctrl-C and resumed, with secrets that must never reach a file."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cliproc import CLI, run_cells
from speedmatrix.sim import Sim

# End-to-end tier: `speedmatrix run` against the built-in engine in real time.
pytestmark = pytest.mark.e2e


def _cells(out: Path) -> dict:
    return {c["id"]: c for c in run_cells(out)}


def test_ctrl_c_keeps_finished_cells_and_resume_completes_the_run(fixed_sim, tmp_path):
    out = tmp_path / "run"
    args = CLI + [
        "run",
        "--url",
        fixed_sim.url,
        "--contexts",
        "64,128,256",
        "--concurrency",
        "1,2",
        "--duration",
        "1s",
        "--max-output",
        "500",
        "--out",
        str(out),
        "--quiet",
    ]
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

    res = subprocess.run(
        CLI + ["run", "--resume", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    after = _cells(out)
    assert len(after) == 6
    for cid, cell in before.items():  # finished cells were not measured again
        assert after[cid]["t0_ns"] == cell["t0_ns"]
    assert json.loads((out / "run.json").read_text())["meta"]["run"]["interrupted"] is False


def test_secrets_never_reach_a_file(fixed_sim, tmp_path):
    from secrets_check import secrets_found  # opens records/*.npz and decodes their strings

    out = tmp_path / "run"
    key = "sk-test-SECRETKEY-1234567890"
    launch_key = "hunter2-LAUNCHSECRET"
    admin_key = "adminKEY-LAUNCHSECRET"
    hf = "hf_TOKENSECRETabcdef"
    launch = (
        f"HF_TOKEN={hf} python -m sglang.launch_server --model-path m --api-key "
        f"{launch_key} --admin-api-key={admin_key} --port 8000"
    )
    res = subprocess.run(
        CLI
        + [
            "run",
            "--url",
            fixed_sim.url,
            "--api-key",
            key,
            "--contexts",
            "64",
            "--concurrency",
            "1",
            "--duration",
            "1s",
            "--max-output",
            "100",
            "--launch-command",
            launch,
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
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


def test_an_interrupted_run_keeps_its_whole_matrix(tmp_path):
    """Ctrl-C in the second decode row: run.json still has the resolved plan ("max" as
    tokens) and every over-capacity cell, the ones of the row never reached included, and
    the matrix read back from it has the "max" row."""
    from speedmatrix.results import load

    out = tmp_path / "run"
    # max decode = 8192 - 500 - 512 -> 7168; max prefill = 8192 - 64 = 8128;
    # N=64 needs 64 x (C + 500) > 20000 tokens: over capacity at both contexts
    with Sim("fixed", overrides={"context_length": 8192, "kv_tokens": 20000}) as s:
        args = CLI + [
            "run",
            "--url",
            s.url,
            "--contexts",
            "256,max",
            "--concurrency",
            "1,64",
            "--prefill-contexts",
            "max",
            "--duration",
            "2s",
            "--max-output",
            "500",
            "--out",
            str(out),
            "--quiet",
            "--no-report",
        ]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "decode-c256-n1-r0" not in _cells(out):
            time.sleep(0.05)
        assert "decode-c256-n1-r0" in _cells(out), proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.5)  # inside the max x 1 cell
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    cells = _cells(out)
    assert "decode-c7168-n1-r0" not in cells  # interrupted, not measured
    for cid in ("decode-c256-n64-r0", "decode-c7168-n64-r0"):
        assert cells[cid]["status"] == "over_capacity"
    plan = json.loads((out / "run.json").read_text())["meta"]["run"]["plan"]
    assert plan["contexts"] == [256, 7168] and plan["prefill_contexts"] == [8128]
    assert plan["keywords"] == {"contexts": {"max": 7168}, "prefill_contexts": {"max": 8128}}
    assert load(out).matrix_definition == {
        "contexts": [256, 7168],
        "concurrency": [1, 64],
        "request_rates": [],
        "prefill_contexts": [8128],
        "search": False,
    }


def test_a_cell_whose_prompts_cannot_be_made_ends_no_run(fixed_sim, tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(
        CLI
        + [
            "run",
            "--url",
            fixed_sim.url,
            "--contexts",
            "4,64",
            "--concurrency",
            "1",
            "--duration",
            "1s",
            "--max-output",
            "50",
            "--out",
            str(out),
            "--no-report",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 3, res.stderr  # some cells failed (docs/RELIABILITY.md)
    assert "Traceback" not in res.stderr
    cells = _cells(out)
    assert cells["decode-c4-n1-r0"]["status"] == "error"
    assert "too short" in cells["decode-c4-n1-r0"]["reason"]
    assert cells["decode-c64-n1-r0"]["status"] == "valid"


def test_tokenizer_flag_without_a_tokenizer_package_is_one_clear_line(fixed_sim, tmp_path):
    import importlib.util

    if importlib.util.find_spec("transformers") or importlib.util.find_spec("tokenizers"):
        pytest.skip("a tokenizer package is installed")
    res = subprocess.run(
        CLI
        + [
            "run",
            "--url",
            fixed_sim.url,
            "--contexts",
            "64",
            "--concurrency",
            "1",
            "--tokenizer",
            "gpt2",
            "--out",
            str(tmp_path / "run"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install tokenizers" in lines[0], res.stderr
