"""One writer per run folder (issue 25): a run, --resume, recompute --write and report hold
the folder's lock; a second writer gets a one-line error naming the holder and writes
nothing; a holder killed with -9 leaves nothing that blocks the next run."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cliproc import CLI, run_cli, run_main
from speedmatrix import runfile, sweep
from speedmatrix.errors import SpeedmatrixError

HOLD = (
    "import sys, time\n"
    "from speedmatrix.runfile import run_lock\n"
    "with run_lock(sys.argv[1], 'run'):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(60)\n"
)


class Holder:
    """Another process holding ``run_dir``'s lock until stopped."""

    def __init__(self, run_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def held(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    h = Holder(run_dir)
    yield run_dir, h
    if h.proc.poll() is None:
        h.kill()


def _doc() -> dict:
    return {"schema": runfile.SCHEMA, "meta": {}, "cells": []}


def test_a_second_writer_is_refused_with_the_holder_named(held):
    run_dir, h = held
    with pytest.raises(runfile.RunLockedError) as err:
        runfile.write_run(run_dir, _doc())
    msg = str(err.value)
    assert f"pid {h.proc.pid} on {socket.gethostname()}" in msg
    assert "speedmatrix run" in msg and "started 20" in msg and "\n" not in msg
    assert not (run_dir / runfile.RUN_FILE).exists()


def test_the_lock_is_reentrant_in_one_process_and_gone_after(tmp_path):
    with runfile.run_lock(tmp_path, "run"):
        runfile.write_run(tmp_path, _doc())  # a sweep's own writes pass under its lock
        assert (tmp_path / runfile.LOCK_FILE).exists()
    assert not (tmp_path / runfile.LOCK_FILE).exists()  # an emptied --out can be removed
    assert [p.name for p in tmp_path.iterdir()] == [runfile.RUN_FILE]


def test_a_holder_still_writing_its_name_is_waited_for_then_named(tmp_path):
    # the race CI met: the refused writer read the lock file between the holder's flock and
    # its write, and named no one
    lock = tmp_path / runfile.LOCK_FILE
    lock.write_text("")
    info = {"pid": 4242, "host": "h", "command": "run", "started": "2026-12-05T00:00:00Z"}
    timer = threading.Timer(0.05, lambda: lock.write_text(json.dumps(info)))
    timer.start()
    try:
        assert runfile._holder(lock).startswith("pid 4242 on h, `speedmatrix run`")
    finally:
        timer.join()
    lock.write_text("{")  # a holder that never finishes writing is named generically
    assert runfile._holder(lock) == "another speedmatrix process"


def test_a_holder_killed_with_minus_9_does_not_block_the_next(held):
    run_dir, h = held
    h.kill()
    assert (run_dir / runfile.LOCK_FILE).exists()  # left behind by the killed holder
    runfile.write_run(run_dir, _doc())  # the kernel let go with the process
    assert (run_dir / runfile.RUN_FILE).is_file()


def test_resume_and_report_and_force_are_refused_while_a_run_holds_the_folder(held):
    run_dir, h = held
    before = _doc()
    # a saved run written before the holder took the folder (copy it in: no lock needed)
    (run_dir / runfile.RUN_FILE).write_text(json.dumps(before))
    with pytest.raises(SpeedmatrixError, match=f"in use by pid {h.proc.pid}"):
        sweep.resume(run_dir, progress=False, report=False)
    # in this process: the holder is another process, and flock tells them apart
    res = run_main("report", str(run_dir))
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and f"pid {h.proc.pid}" in res.stderr, res.stderr
    assert not (run_dir / "report.md").exists()
    res = run_main("run", "--url", "http://127.0.0.1:9", "--out", str(run_dir), "--force")
    assert res.returncode == 1 and f"pid {h.proc.pid}" in res.stderr, res.stderr
    assert run_dir.is_dir() and not list(run_dir.parent.glob("run.replaced-*"))
    assert json.loads((run_dir / runfile.RUN_FILE).read_text()) == before


@pytest.mark.e2e
def test_two_runs_into_one_folder_at_once_one_is_refused(fixed_sim, tmp_path):
    out = tmp_path / "run"
    args = [
        "run",
        "--url",
        fixed_sim.url,
        "--contexts",
        "64",
        "--concurrency",
        "1",
        "--duration",
        "1s",
        "--out",
        str(out),
        "--quiet",
        "--no-report",
    ]
    procs = [
        subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    refused = next(err for code, err in results if code == 1)
    assert refused.count("\n") == 1, refused
    assert "in use by pid" in refused or "holds another run" in refused, refused
    doc = json.loads((out / runfile.RUN_FILE).read_text())
    assert doc["cells"] and all(c["status"] == "valid" for c in doc["cells"])
    # every records file on disk is one of the saved run's: the refused run wrote none
    saved = sorted(c["records"] for c in doc["cells"] if c.get("records"))
    on_disk = sorted(f"{runfile.RECORDS_DIR}/{p.name}" for p in (out / "records").glob("*"))
    assert on_disk == saved
    assert not (out / runfile.LOCK_FILE).exists()


LEFT = [
    ".run.json.k2j3h4g5.tmp",
    ".report.md.abcd_123.tmp",
    ".cells.csv.tmp",
    ".tokens.parquet.tmp",
]
KEPT = [
    ".mynotes.tmp",
    "notes.tmp",
    ".run.json",
    "run.tmp.json",
    ".x.tmp",
    ".run.json.ABCDEFGH.tmp",
]


def test_temp_files_left_by_kill_9_are_removed_and_only_ours(tmp_path):
    (tmp_path / "plots").mkdir()
    (tmp_path / "records").mkdir()
    for name in LEFT + KEPT:
        (tmp_path / name).write_text("x")
    (tmp_path / "plots" / ".ttft.svg.q1w2e3r4.tmp").write_text("x")
    (tmp_path / "records" / ".decode-c64-n1-r0.q1w2e3r4.npz").write_text("x")
    (tmp_path / "records" / "decode-c64-n1-r0.npz").write_text("x")
    removed = runfile.clean_stale_temp(tmp_path)
    assert removed == sorted(
        LEFT + ["plots/.ttft.svg.q1w2e3r4.tmp", "records/.decode-c64-n1-r0.q1w2e3r4.npz"]
    )
    left = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert left == set(KEPT) | {"records/decode-c64-n1-r0.npz"}


@pytest.mark.e2e
def test_the_next_run_cleans_what_a_killed_one_left(fixed_sim, tmp_path):
    out = tmp_path / "run"
    (out / "records").mkdir(parents=True)
    (out / ".run.json.k2j3h4g5.tmp").write_text("{")
    (out / "records" / ".decode-c64-n1-r0.q1w2e3r4.npz").write_text("x")
    res = run_cli(
        "run",
        "--url",
        fixed_sim.url,
        "--contexts",
        "64",
        "--concurrency",
        "1",
        "--duration",
        "1s",
        "--out",
        str(out),
        "--no-report",
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "removed 2 temporary file(s)" in res.stderr + res.stdout
    assert not list(out.rglob(".*.tmp")) and not list((out / "records").glob(".*"))
