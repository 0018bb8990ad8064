"""The command line: bad flags and unreachable targets give one clear line and a
non-zero exit before any work starts; --help and --version work."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speedmatrix.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, needle", [
    (["run", "--url", "http://127.0.0.1:9", "--contexts", "8x", "--concurrency", "1",
      "--out", "o"], "8x"),
    (["run", "--url", "http://127.0.0.1:9", "--contexts", "8k", "--concurrency", "0",
      "--out", "o"], "concurrency"),
    (["run", "--url", "http://127.0.0.1:9", "--contexts", "8k", "--concurrency", "1,two",
      "--out", "o"], "two"),
    (["run", "--url", "http://127.0.0.1:9", "--contexts", "8k", "--duration", "5parsecs",
      "--out", "o"], "5parsecs"),
    (["run", "--contexts", "8k", "--out", "o"], "--url"),
    (["run", "--url", "http://127.0.0.1:9", "--contexts", "8k"], "--out"),
    (["run", "--url", "http://127.0.0.1:9", "--bogus-flag"], "--bogus-flag"),
    (["run", "--url", "http://127.0.0.1:9", "--api", "grpc", "--out", "o"], "grpc"),
    (["run", "--url", "http://127.0.0.1:9", "--extra-body", "{not json", "--out", "o"],
     "extra-body"),
    (["report", "/nonexistent/run"], "run.json"),
])
def test_bad_flags_give_one_line_and_exit_2(args, needle, tmp_path):
    res = _cli(*args)
    assert res.returncode == 2, res
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("speedmatrix: error:")
    assert needle in lines[0]
    assert not (tmp_path / "o").exists()


def test_unreachable_server_is_one_line_and_exit_1(tmp_path):
    port = _free_port()  # nothing listens there
    out = tmp_path / "run"
    res = _cli("run", "--url", f"http://127.0.0.1:{port}", "--contexts", "1k",
               "--concurrency", "1", "--duration", "1s", "--out", str(out))
    assert res.returncode == 1, res
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert f"127.0.0.1:{port}" in lines[0]
    assert "refused" in lines[0] or "reach" in lines[0]


def test_version_and_help():
    res = _cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("speedmatrix ")
    res = _cli("run", "--help")
    assert res.returncode == 0
    for flag in ("--contexts", "--concurrency", "--prefill-contexts", "--duration",
                 "--max-output", "--api-key", "--out", "--resume", "--kv-capacity"):
        assert flag in res.stdout
