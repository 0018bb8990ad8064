"""The terminal display of a sweep.

On a terminal: a live view (rich) of the matrix grid filling in cell by cell (each cell's
total tok/s and status as it finishes, the running cell marked), and under it the current
cell's phase (warm-up, or window seconds of D), its live tok/s, requests in flight, failed
requests so far, the server's running / waiting requests and KV use (the cell's own /metrics
sampler's latest sample, never a second scrape; shown only when the server has the metric),
and the ETA of the whole matrix. While the window's requests are still prefilling, the line
says so ("prefilling: 3 of 8 first tokens") instead of a tok/s that reads 0. In a Jupyter
notebook: the same view as one output that updates in place (``IPython.display`` with a
display id), the finished cells' lines above it. Elsewhere (a log file, a pipe): a line per
cell, as plain text.

A daemon thread redraws four times a second from `Progress.live`, which the sweep replaces
at each cell; the thread only reads it (and the running cell's
`_core.CellRunner.progress()`), so no lock is needed.

The ETA never reads zero while work remains: the current cell's remaining time is its
estimate less what has elapsed, but at least what its window still has to run (or one
second while it warms up past its estimate), plus the estimate of the cells after it
(``dryrun.estimate_s``, from the prefill rate measured so far).
"""

from __future__ import annotations

import io
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from speedmatrix._native import _core
from speedmatrix.dryrun import CELL_OVERHEAD_S
from speedmatrix.redact import redact, redact_known
from speedmatrix.report import formatting as fmt

__all__ = ["NotebookView", "Progress", "fmt_eta", "in_notebook", "server_text"]

#: the least the ETA shows while a cell is still running
MIN_ETA_S = 1.0


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
    #: the estimate of this cell alone (its share of eta_s); 0 = unknown
    cell_s: float = 0.0
    #: (context, concurrency) of a decode cell in the grid, None for a prefill cell
    key: tuple[int, int] | None = None


@dataclass
class _Grid:
    """The decode matrix: row labels, concurrency levels and each cell's text and style."""

    contexts: list[tuple[int, str]] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=list)
    cells: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)


_STATUS_STYLE = {
    "valid": "green",
    "queued": "dark_orange",
    "over_capacity": "grey50",
    "error": "bold red",
}


def cell_text(cell: dict) -> tuple[str, str]:
    """(text, rich style) of a finished or planned decode cell in the grid."""
    status = cell.get("status")
    if status == "over_capacity":
        return "over cap.", _STATUS_STYLE["over_capacity"]
    if status == "error":
        return ("not run" if cell.get("not_run") else "error"), _STATUS_STYLE["error"]
    total = cell.get("total_tok_s")
    if fmt.missing(total):  # None or NaN: absent, never "nan" or 0
        return fmt.DASH, "grey50"
    text = fmt.tok_s(total)
    if cell.get("flags"):
        text += " ⚑"
    if status == "queued":
        text += " q"
    return text, _STATUS_STYLE.get(str(status), "")


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where stderr is no terminal and a live view that redraws
    by moving the cursor cannot work)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython  # optional: IPython is there only in a notebook
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class NotebookView:
    """One notebook output that the view updates in place: the finished cells' lines, then
    the grid and the running cell's line, as plain text. ``display`` is
    ``IPython.display.display`` (a test passes its own)."""

    #: the most finished-cell lines kept above the grid (a long matrix scrolls no output away)
    MAX_LINES = 200

    def __init__(self, display: Any = None):
        if display is None:
            try:
                from IPython.display import display  # optional: only ever called in a notebook
            except ImportError as e:  # made only where in_notebook() found IPython
                raise RuntimeError("the notebook view needs IPython") from e
        self.lines: list[str] = []
        self._handle = display({"text/plain": ""}, raw=True, display_id=True)

    def update(self, view: str) -> None:
        text = "\n".join([*self.lines[-self.MAX_LINES :], view]).rstrip()
        self._handle.update({"text/plain": text}, raw=True)


class Progress:
    """The live view on a terminal, a line per cell otherwise (see the module doc)."""

    def __init__(self, enabled: bool, stream=None, notebook: Any = None):
        """``notebook``: a `NotebookView` to draw into (found by itself inside a Jupyter
        kernel; a terminal or a pipe otherwise)."""
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.notebook: NotebookView | None = notebook if enabled else None
        if self.notebook is None and enabled and not self.tty and in_notebook():
            try:
                self.notebook = NotebookView()
            except Exception:  # noqa: BLE001 - no display: the plain lines still work
                self.notebook = None
        self.live = _Live()
        self.grid = _Grid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rich: Any = None  # rich.live.Live once started
        self._failed: str | None = None
        #: known secrets (the API key): replaced, with redact()'s patterns, in every line shown
        self.secrets: list[str] = []
        #: which sampled /metrics name is the server's running / waiting count and KV use
        #: (a fraction of the pool); a role the server lacks is absent
        self.metric_roles: dict[str, str] = {}

    # ------------------------------------------------------------ what the sweep calls
    def plan(self, planned, cells: dict[str, dict] | None = None) -> None:
        """The grid's layout from the plan: every decode cell, the statuses known before
        any request (over capacity) and the cells a resumed run already has."""
        cells = cells or {}
        seen_ctx: dict[int, str] = {}
        conc: list[int] = []
        for c in planned:
            if c.phase != "decode":
                continue
            seen_ctx.setdefault(c.context, c.label)
            if c.concurrency not in conc:
                conc.append(c.concurrency)
            done = cells.get(c.id)
            if done is not None and not done.get("not_run"):
                self.grid.cells[(c.context, c.concurrency)] = cell_text(done)
            elif c.status is not None:
                self.grid.cells[(c.context, c.concurrency)] = cell_text(
                    {"status": c.status, "not_run": None}
                )
        self.grid.contexts = list(seen_ctx.items())
        self.grid.concurrency = conc

    def _clean(self, text: str) -> str:
        return redact_known(redact(text), self.secrets)

    def start_cell(
        self,
        index: int,
        total: int,
        label: str,
        duration_s: float,
        eta_s: float,
        runner: Any = None,
        *,
        cell_s: float = 0.0,
        key: tuple[int, int] | None = None,
    ) -> None:
        self.live = _Live(
            index, total, label, time.monotonic(), duration_s, runner, eta_s, cell_s, key
        )
        if not self.enabled:
            return
        if self.tty or self.notebook is not None:
            self._start_live()
        else:
            print(f"[{index}/{total}] {label} (ETA {fmt_eta(eta_s)})", file=self.stream, flush=True)

    def end_cell(self, summary: str, cell: dict | None = None) -> None:
        live = self.live
        if cell is not None and cell.get("phase") == "decode":
            self.grid.cells[(int(cell["context"]), int(cell["concurrency"]))] = cell_text(cell)
        if not self.enabled:
            self.live = _Live()
            return
        line = self._clean(f"[{live.index}/{live.total}] {live.label}: {summary}")
        if self.notebook is not None:
            self.notebook.lines.append(line)
            self.live = _Live()
            self.refresh()
            return
        if self.tty and self._rich is not None:
            self._rich.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)
        self.live = _Live()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.notebook is not None:
            self.notebook.lines.append(self._clean(text))
            self.refresh()
            return
        if self.tty and self._rich is not None:
            self._rich.console.print(self._clean(text), markup=False, highlight=False)
        else:
            print(self._clean(text), file=self.stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
        if self._rich is not None:
            self._rich.update(self._render(final=True), refresh=True)
            self._rich.stop()
            self._rich = None
        if self.notebook is not None:
            self.notebook.update(self.text(final=True))

    def refresh(self) -> None:
        """Draw the view once more (the display thread calls it four times a second)."""
        if self._rich is not None:
            self._rich.update(self._render(), refresh=True)
        elif self.notebook is not None:
            self.notebook.update(self.text())

    def text(self, final: bool = False, width: int = 120) -> str:
        """The view as plain text (a notebook's output, a test's reading)."""
        # force_jupyter=False: in a kernel rich would display the text itself, not return it
        console = Console(
            file=io.StringIO(),
            width=width,
            color_system=None,
            highlight=False,
            force_jupyter=False,
        )
        console.print(self._render(final=final))
        return console.file.getvalue()  # type: ignore[attr-defined]

    # ------------------------------------------------------------ the live view
    def _start_live(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        if self.notebook is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
            return
        if self._rich is not None:
            return
        console = Console(file=self.stream, force_terminal=True, highlight=False)
        self._rich = Live(
            self._render(),
            console=console,
            auto_refresh=False,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._rich.start()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            if self._rich is None and self.notebook is None:
                return
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - a display glitch must never stop a sweep
                self._failed = f"{type(exc).__name__}: {exc}"  # kept for a debugger, not shown

    def status(self, now: float | None = None) -> dict[str, Any]:
        """What the view shows of the current cell: phase, window seconds, tok/s, in flight,
        errors and the ETA (seconds) of the whole matrix."""
        live = self.live
        out: dict[str, Any] = {"label": live.label, "phase": "", "eta_s": 0.0}
        if not live.label:
            return out
        now = time.monotonic() if now is None else now
        elapsed = now - live.started
        out["elapsed_s"] = elapsed
        if live.cell_s:  # the estimate's warm-up share: the cell less its window and overhead
            out["warmup_est_s"] = max(live.cell_s - live.duration_s - CELL_OVERHEAD_S, 0.0)
        window_left = live.duration_s
        runner = live.runner
        if runner is not None:
            p = runner.progress()
            out["errors"] = int(p.get("errors", 0))
            out["in_flight"] = int(p.get("in_flight", 0))
            out.update(self._server(p.get("metrics") or {}))
            t0 = p.get("window_start_ns", -1)
            if t0 and t0 > 0:
                el = max((_core.now_ns() - t0) / 1e9, 1e-3)
                out["phase"] = "window"
                out["window_s"] = el
                out["tok_s"] = p["tokens"] / el
                out.update(_prefilling(p))
                window_left = max(live.duration_s - el, 0.0)
            elif p.get("warmup_total") and p.get("warmup_done", 0) < p["warmup_total"]:
                out["phase"] = "warm-up"
                out["warmup_done"] = int(p["warmup_done"])
                out["warmup_total"] = int(p["warmup_total"])
            elif p.get("warmup_total"):
                out["phase"] = "ramp"  # every prompt prefilled; waiting for every stream
            else:
                out["phase"] = "warm-up"
        else:
            out["phase"] = "preparing"
        rest = max(live.eta_s - live.cell_s, 0.0) if live.cell_s else 0.0
        current = max(live.cell_s - elapsed, window_left, MIN_ETA_S)
        out["eta_s"] = rest + current if live.cell_s else max(live.eta_s - elapsed, MIN_ETA_S)
        return out

    def _server(self, latest: dict[str, float | None]) -> dict[str, float]:
        """The server's state from the sampler's latest sample: server_running,
        server_waiting, server_kv_usage (0..1), each only when the server gave it."""
        out: dict[str, float] = {}
        for role, name in self.metric_roles.items():
            value = latest.get(name)
            if value is not None and math.isfinite(value):
                out[f"server_{role}"] = float(value)
        return out

    def _render(self, final: bool = False):
        g = self.grid
        table = Table(
            title="total tok/s",
            title_justify="left",
            caption="⚑ flagged · q queued · over cap. not run · ▶ running",
            caption_justify="left",
            box=None,
        )
        table.add_column("context", justify="right", style="bold")
        for n in g.concurrency:
            table.add_column(str(n), justify="right", min_width=7)
        current = self.live.key if not final else None
        for ctx, label in g.contexts:
            row: list[Any] = [label]
            for n in g.concurrency:
                if (ctx, n) == current:
                    row.append(Text("▶ …", style="bold cyan"))
                    continue
                text, style = g.cells.get((ctx, n), ("·", "grey50"))
                row.append(Text(text, style=style))
            table.add_row(*row)
        parts: list[Any] = [table] if g.contexts else []
        s = self.status()
        if s["label"] and not final:
            live = self.live
            line = Text(f"[{live.index}/{live.total}] {live.label}: ", style="bold")
            if s["phase"] == "window":
                line.append(f"window {s['window_s']:.0f}/{live.duration_s:.0f}s · ")
                if "first_tokens" in s:  # no tok/s yet: it would read 0 while they prefill
                    line.append(
                        f"prefilling: {s['first_tokens']} of {s['first_tokens_of']} first tokens"
                    )
                else:
                    line.append(f"{s['tok_s']:,.1f} tok/s")
                line.append(f" · {s['in_flight']} in flight")
            elif s["phase"] == "warm-up" and s.get("warmup_total"):
                line.append(
                    f"warm-up: {s['warmup_done']} of {s['warmup_total']} prefilled, "
                    f"{s['elapsed_s']:.0f}s"
                )
                if s.get("warmup_est_s", 0) >= 1:
                    line.append(f" of ~{s['warmup_est_s']:.0f}s")
            elif s["phase"] == "ramp":
                line.append("ramping up (waiting for every stream to decode)")
            elif s["phase"] == "warm-up":
                line.append(f"warm-up: {s['in_flight']} requests prefilling, {s['elapsed_s']:.0f}s")
                if s.get("warmup_est_s", 0) >= 1:
                    line.append(f" of ~{s['warmup_est_s']:.0f}s")
            else:
                line.append(s["phase"])
            server = server_text(s)
            if server:
                line.append(f" · {server}")
            if s.get("errors"):
                line.append(f" · {s['errors']} failed", style="bold red")
            line.append(f" · ETA {fmt_eta(s['eta_s'])}", style="cyan")
            parts.append(line)
        return Group(*parts)


def _prefilling(p: dict[str, Any]) -> dict[str, int]:
    """``first_tokens`` (n) and ``first_tokens_of`` (m) while the window's first requests are
    still prefilling (none has finished and some have no first token yet, or no token came
    at all), else {}: the view then says "prefilling: n of m first tokens", not 0 tok/s."""
    in_flight = int(p.get("in_flight", 0))
    finished = int(p.get("completed", 0)) + int(p.get("errors", 0))
    first = p.get("first_tokens")
    if first is None:  # a core without the count: only "no token yet" is known
        no_token = not p.get("tokens") and in_flight > 0
        return {"first_tokens": 0, "first_tokens_of": in_flight} if no_token else {}
    if finished == 0 and int(first) < in_flight:
        return {"first_tokens": int(first), "first_tokens_of": in_flight}
    return {}


def server_text(status: dict[str, Any]) -> str:
    """What `Progress.status` knows of the server as "server 8 running · 2 waiting · KV 43%";
    "" when it knows nothing (no /metrics, or no sample yet)."""
    parts = []
    if "server_running" in status:
        parts.append(f"{status['server_running']:.0f} running")
    if "server_waiting" in status:
        parts.append(f"{status['server_waiting']:.0f} waiting")
    if "server_kv_usage" in status:
        parts.append(f"KV {100 * status['server_kv_usage']:.0f}%")
    return "server " + " · ".join(parts) if parts else ""


def fmt_eta(seconds: float) -> str:
    seconds = math.ceil(max(seconds, 0))  # rounded up: 0.4 s left is not "0m00s"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"
