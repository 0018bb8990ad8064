"""The sweep's progress display: on a terminal a live view (the matrix grid filling in,
the current cell's phase, live tok/s and the ETA of the whole matrix); elsewhere a line
per cell. Run against the built-in engine (fixed: ITL 20 ms, so N streams make
about N x 50 tok/s)."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
import speedmatrix
from speedmatrix.matrix import Matrix
from speedmatrix.sim import Sim
from speedmatrix.sweep import Sweep

# End-to-end tier: a sweep in real time.
pytestmark = pytest.mark.e2e


def _run(tmp_path, monkeypatch, stream) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    with Sim("fixed") as sim:
        m = Matrix(
            contexts=[128], concurrency=[2, 4], duration_s=1.5, max_output=1000, prefill_contexts=[]
        )
        code = Sweep(sim.url, m, tmp_path, progress=True, report=False).execute()
    assert code == 0
    return stream.getvalue()


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _pty_run(tmp_path, argv, timeout_s=120) -> list[str]:
    """Runs the CLI on a pseudo-terminal; returns the screen updates as plain text frames
    (split where the live view moves the cursor back up to redraw)."""
    import os
    import pty
    import select
    import subprocess
    import time

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    env["PYTHONPATH"] = str(Path(speedmatrix.__file__).resolve().parents[1])  # the one under test
    proc = subprocess.Popen(
        [sys.executable, "-m", "speedmatrix.cli", *argv],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=tmp_path,
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data.decode("utf-8", "replace"))
        elif proc.poll() is not None:
            break
    proc.wait(timeout=10)
    os.close(master)
    assert proc.returncode == 0, "".join(chunks)[-3000:]
    text = "".join(chunks)
    frames = re.split(r"\x1b\[\d*A", text)  # rich redraws by moving the cursor up
    return [_ANSI.sub("", f).replace("\r", "") for f in frames]


def test_live_view_in_a_pseudo_terminal(tmp_path):
    """The grid appears with every cell pending, fills in as cells finish, shows the running
    cell's window and tok/s, and the ETA never reads 0 while a cell is pending."""
    from speedmatrix.sim import Sim as _Sim

    with _Sim("fixed") as sim:
        frames = _pty_run(
            tmp_path,
            [
                "run",
                "--url",
                sim.url,
                "--contexts",
                "128,256",
                "--concurrency",
                "1,2",
                "--prefill-contexts",
                "none",
                "--duration",
                "1.5s",
                "--max-output",
                "1000",
                "--kv-capacity",
                "2400",
                "--out",
                "run",
                "--no-report",
            ],
        )
    live = [f for f in frames if "total tok/s" in f and "ETA" in f]
    assert len(live) >= 5, frames[-3:]
    first = live[0]
    # the grid: both contexts, both concurrency levels; 256 x 2 over capacity from the plan
    assert re.search(r"context\s+1\s+2", first), first
    assert "over cap." in first and "▶" in first
    # it fills: a later frame has figures where the first had pending dots
    figures = [len(re.findall(r"\d+\.\d\b", f.split("total tok/s")[1].split("[")[0])) for f in live]
    assert figures[0] == 0 and max(figures) >= 2, figures
    windows = [f for f in live if re.search(r"window \d+/2s · [\d,.]+ tok/s", f)]
    assert windows, live[-1]
    for f in live:
        eta = re.search(r"ETA (\d+)m(\d\d)s", f)
        assert eta and (int(eta.group(1)), int(eta.group(2))) != (0, 0), f
    # the server's own running count, from the cell's /metrics sampler (the sim serves one)
    assert any(re.search(r"server \d+ running", f) for f in windows), windows[-1]
    # finished cells keep their summary lines above the view
    assert any("[3/3] decode 256 x 1:" in f and "TTFT" in f for f in frames)


def test_eta_counts_the_current_cell_and_never_reaches_zero():
    from speedmatrix.progress import MIN_ETA_S, Progress

    p = Progress(False)
    p.start_cell(1, 3, "decode 8K x 4", 30.0, eta_s=100.0, cell_s=40.0, key=(8192, 4))
    t0 = p.live.started
    assert p.status(t0)["eta_s"] == pytest.approx(100.0)
    from speedmatrix.dryrun import CELL_OVERHEAD_S

    assert p.status(t0)["warmup_est_s"] == pytest.approx(40.0 - 30.0 - CELL_OVERHEAD_S)
    assert p.status(t0 + 10)["eta_s"] == pytest.approx(90.0)
    # a warm-up far longer than estimated: the rest of the matrix plus the window still to run
    assert p.status(t0 + 500)["eta_s"] == pytest.approx(60.0 + 30.0)
    p.start_cell(3, 3, "decode 8K x 8", 0.0, eta_s=5.0, cell_s=5.0, key=(8192, 8))
    assert p.status(p.live.started + 60)["eta_s"] == MIN_ETA_S


class _FakeRunner:
    """`_core.CellRunner.progress()` as a display reads it, mid-window."""

    def __init__(self, metrics: dict):
        from speedmatrix._native import _core

        self.p = {
            "tokens": 500,
            "completed": 9,
            "errors": 0,
            "in_flight": 10,
            "window_start_ns": _core.now_ns() - 2_000_000_000,
            "warmup_total": 10,
            "warmup_done": 10,
            "metrics": metrics,
            "metrics_t_ns": 1,
            "metrics_samples": 3,
            "metrics_failures": 0,
        }

    def progress(self) -> dict:
        return self.p


def _line(p) -> str:
    from rich.console import Console

    console = Console(width=200, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(p._render())
    return cap.get()


def test_the_running_cells_line_shows_the_servers_running_waiting_and_kv_use():
    from speedmatrix.progress import Progress

    p = Progress(False)
    p.metric_roles = {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv_usage": "vllm:kv_cache_usage_perc",
    }
    latest = {
        "vllm:num_requests_running": 8.0,
        "vllm:num_requests_waiting": 2.0,
        "vllm:kv_cache_usage_perc": 0.434,
    }
    p.start_cell(1, 2, "decode 1K x 10", 30.0, eta_s=60.0, runner=_FakeRunner(latest))
    s = p.status()
    assert (s["server_running"], s["server_waiting"], s["server_kv_usage"]) == (8, 2, 0.434)
    text = _line(p)
    assert "[1/2] decode 1K x 10: window 2/30s" in text, text
    assert "10 in flight · server 8 running · 2 waiting · KV 43% · ETA" in text, text
    # a metric absent from the latest scrape (None) is left out, the rest still shown
    latest["vllm:num_requests_waiting"] = None
    assert "server 8 running · KV 43% · ETA" in _line(p)
    # a server without a KV metric: no role, nothing about KV
    del p.metric_roles["kv_usage"]
    assert "KV" not in _line(p)


def test_nothing_of_the_server_is_shown_without_metrics():
    from speedmatrix.progress import Progress

    p = Progress(False)
    p.start_cell(1, 1, "decode 1K x 10", 30.0, eta_s=60.0, runner=_FakeRunner({}))
    assert not any(k.startswith("server_") for k in p.status())
    assert "server" not in _line(p)
    # roles known, but no sample yet
    p.metric_roles = {"running": "vllm:num_requests_running"}
    assert "server" not in _line(p)


def test_the_grid_takes_the_plan_and_each_finished_cell():
    from speedmatrix.plan import plan
    from speedmatrix.progress import Progress

    m = Matrix(contexts=[1024, 4096], concurrency=[1, 8], max_output=64, prefill_contexts=[])
    planned = plan(m, kv_tokens=20_000, context_length=8192)
    p = Progress(False)
    p.plan(planned)
    assert p.grid.contexts == [(1024, "1K"), (4096, "4K")] and p.grid.concurrency == [1, 8]
    assert p.grid.cells == {(4096, 8): ("over cap.", "grey50")}
    cell = {"phase": "decode", "context": 1024, "concurrency": 8, "status": "queued"}
    p.end_cell("x", {**cell, "total_tok_s": 12345.0, "flags": ["drift"]})
    assert p.grid.cells[(1024, 8)][0] == "12.3K ⚑ q"


def test_not_a_terminal_gives_a_line_per_cell(tmp_path, monkeypatch):
    text = _run(tmp_path, monkeypatch, io.StringIO())
    assert "\x1b[K" not in text  # no cursor control in a log file
    lines = [ln for ln in text.splitlines() if ln.startswith("[")]
    assert lines[0].startswith("[1/2]") and "(ETA " in lines[0], lines
    assert any(ln.startswith("[2/2]") and "tok/s" in ln and "TTFT" in ln for ln in lines), lines


@pytest.mark.parametrize(
    "seconds, text", [(0, "0m00s"), (0.4, "0m01s"), (61, "1m01s"), (3725, "1h02m")]
)
def test_eta_format(seconds, text):
    from speedmatrix.progress import fmt_eta

    assert fmt_eta(seconds) == text
