"""The shard actor: one per client node (`speedmatrix.shards.pool` places them), wrapping
the C++ core. It answers clock pings, and runs a cell's part at a common start time:
everything it sends and receives stays on its node; only its end-of-cell records go back.

A plain class: `pool` makes it a Ray actor (so this module imports without Ray).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from speedmatrix._native import _core
from speedmatrix.records import Records
from speedmatrix.shards.deal import build_spec

__all__ = ["ShardActor", "boot_id"]

NEVER = -1


def boot_id() -> str:
    """This kernel's boot id: processes that share it share one CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class ShardActor:
    """Runs one shard's part of each cell (threaded: `stop` and `now_ns` answer while
    `run` runs)."""

    def __init__(self, index: int):
        self.index = index
        self._runner: Any = None
        self._stopped = False
        self._lock = threading.Lock()

    def node(self) -> dict[str, str]:
        return {"host": socket.gethostname(), "boot_id": boot_id()}

    def now_ns(self) -> int:
        return int(_core.now_ns())

    def run(
        self, fields: dict[str, Any], api_key: str | None, start_at_ns: int, late_ns: int
    ) -> dict:
        """Waits for ``start_at_ns`` (this node's clock), runs the part, returns its raw
        records. A part that cannot start on time does not start at all: it sends no load
        and says when it was ready (the driver makes the cell an error)."""
        runner = _core.CellRunner(build_spec(fields, api_key))
        with self._lock:
            self._runner, self._stopped = runner, False
        while (left := start_at_ns - _core.now_ns()) > 0 and not self._stopped:
            time.sleep(min(left / 1e9, 0.05))
        started = int(_core.now_ns())
        if self._stopped or started - start_at_ns > late_ns:
            return {"started_ns": started, "ran": False}
        res = runner.run()
        with self._lock:
            self._runner = None
        rec = Records.from_result(res)
        return {
            "started_ns": started,
            "ran": True,
            "requests": dict(rec.requests),
            "events": dict(rec.events),
            "stamps": rec.stamps(),
        }

    def progress(self) -> dict:
        """The running part's live counters (the core's `CellRunner.progress`); {} between
        parts."""
        runner = self._runner
        return dict(runner.progress()) if runner is not None else {}

    def stop(self) -> None:
        """Ends the running part early (its records are kept), or its wait to start."""
        with self._lock:
            self._stopped = True
            if self._runner is not None:
                self._runner.stop()
