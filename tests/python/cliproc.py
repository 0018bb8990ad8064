"""What the command-line tests share: the CLI run as a subprocess (the speedmatrix under
test, as installed) or in this process (``cli.main``, the same code without the interpreter's
start-up: for tests of what a command says, not of the process), a free local port, and the
cells of a run folder as saved so far."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "speedmatrix.cli"]


def run_cli(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


def run_main(*args: str) -> subprocess.CompletedProcess:
    """``speedmatrix ARGS`` through ``cli.main`` in this process, as run_cli answers it."""
    from speedmatrix import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return subprocess.CompletedProcess([*CLI, *args], code, out.getvalue(), err.getvalue())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cells(out: Path) -> list[dict]:
    """The cells of ``out/run.json``; [] while there is none or it is being replaced."""
    try:
        return json.loads((out / "run.json").read_text())["cells"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return []
