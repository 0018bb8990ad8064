"""The terminal display of a sweep: one live status line on a terminal (a line per cell
otherwise) with the current cell, its tok/s and the ETA of the whole matrix.

A daemon thread redraws the line four times a second from `Progress.live`, which the
sweep replaces at each cell; the thread only reads it (and the running cell's
`_core.CellRunner.progress()`), so no lock is needed.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Progress", "fmt_eta"]


@dataclass
class _Live:
    """Progress state shared with the display thread."""

    index: int = 0
    total: int = 0
    label: str = ""
    started: float = 0.0
    duration_s: float = 0.0
    runner: Any = None
    eta_s: float = 0.0


class Progress:
    """One status line on a terminal (a line per cell otherwise): the current
    cell, its live tok/s and the ETA of the whole matrix."""

    def __init__(self, enabled: bool, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.live = _Live()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start_cell(
        self,
        index: int,
        total: int,
        label: str,
        duration_s: float,
        eta_s: float,
        runner: Any = None,
    ) -> None:
        self.live = _Live(index, total, label, time.monotonic(), duration_s, runner, eta_s)
        if not self.enabled:
            return
        if self.tty:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True)
                self._thread.start()
        else:
            print(f"[{index}/{total}] {label} (ETA {fmt_eta(eta_s)})", file=self.stream, flush=True)

    def end_cell(self, summary: str) -> None:
        if not self.enabled:
            return
        live = self.live
        line = f"[{live.index}/{live.total}] {live.label}: {summary}"
        if self.tty:
            self.stream.write("\r\033[K" + line + "\n")
            self.stream.flush()
        else:
            print(line, file=self.stream, flush=True)
        self.live = _Live()

    def message(self, text: str) -> None:
        if self.enabled:
            if self.tty:
                self.stream.write("\r\033[K")
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            live = self.live
            if not live.label:
                continue
            tok_s = ""
            runner = live.runner
            if runner is not None:
                p = runner.progress()
                t0 = p.get("window_start_ns", -1)
                if t0 and t0 > 0:
                    from speedmatrix._native import _core

                    el = max((_core.now_ns() - t0) / 1e9, 1e-3)
                    tok_s = f" {p['tokens'] / el:,.1f} tok/s, {el:.0f}/{live.duration_s:.0f}s"
                elif p.get("warmup_total") and p.get("warmup_done", 0) < p["warmup_total"]:
                    tok_s = f" warming up, {p['warmup_done']} of {p['warmup_total']} prefilled"
                else:
                    tok_s = " ramping up (waiting for every stream)"
            el_cell = time.monotonic() - live.started
            eta = max(live.eta_s - el_cell, 0)
            self.stream.write(
                f"\r\033[K[{live.index}/{live.total}] {live.label}:{tok_s}  ETA {fmt_eta(eta)}"
            )
            self.stream.flush()


def fmt_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"
