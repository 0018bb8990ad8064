"""Running a matrix: discovery, planning, the prefill phase, decode cells, statuses.

One `Sweep` measures one server with one `Matrix` (DESIGN.md, "Measurement
definitions"):

* the target is probed once (`speedmatrix.adapters.discover`), the cells are
  planned (`speedmatrix.plan.plan`: over-capacity cells are never run);
* before every cell the server must be seen idle; a cell that starts on a busy
  server is flagged `busy_at_start`;
* a decode cell warms the prefix cache with its N prompts (max_tokens=1), then
  measures a closed-loop window of D seconds; at its end everything in flight is
  cancelled. The prefill figure of context C is the cold TTFT of the N=1 warm-up
  ("measured during decode warm-up"); contexts without such a cell get a
  standalone prefill cell (one cold request per repetition);
* figures come from the raw records through `_core.summarize_cell`, the same
  function that recomputes them from a saved run;
* `run.json` is rewritten atomically after every cell, so a crash or Ctrl-C loses
  at most the cell in progress, and `--resume` continues without redoing cells;
  the resolved plan (meta.run.plan) and the cells it will not run are written
  before the first cell;
* a cell whose prompts cannot be made is an `error` cell and the sweep goes on;
  before every cell after the first and after a cell with failed requests the
  server is asked whether it still answers; when it does not, the cells left are marked `error` ("server unreachable",
  `not_run`: `--resume` measures them) instead of each spending its window.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speedmatrix import __version__, runfile
from speedmatrix.errors import SpeedmatrixError

# A cell is `queued` when, once its first wave of N requests was admitted, on
# average at least this many requests waited: the server's waiting count when it
# has metrics, else requests in flight without streaming (client side).
QUEUE_GAP_REQUESTS = 0.5
# The client is the bottleneck when its thread used this share of a core.
CLIENT_BOUND_CPU_SHARE = 0.85
# A cell whose first wave took more than this share of the window to stream (or
# never all streamed) is flagged: its figures include a long ramp-up.
RAMP_SHARE = 0.2
#: A cell's median TTFT counts only the requests that got a first token. When
#: more than this share of the requests sent in the window were still waiting
#: at its end, longer than that median, the median reads low: flag it.
TTFT_UNSERVED_SHARE = 0.05
# An error message kept per error kind in a cell (`error_examples`) is cut to this
# many characters: enough to say why, never a request body.
ERROR_EXAMPLE_CHARS = 300
# After a cell with failed requests the server is asked whether it still answers:
# this many tries, this far apart (a refused connection fails at once).
REPROBE_TRIES = 3
REPROBE_PAUSE_S = 0.5
#: `not_run` of the cells left when the server stopped answering; `--resume` redoes them
SERVER_UNREACHABLE = "server_unreachable"


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _interval(ci: Any) -> list[float | None] | None:
    if not ci:
        return None
    lo, hi = _finite(ci[0]), _finite(ci[1])
    return None if lo is None or hi is None else [lo, hi]


@dataclass
class CellOutcome:
    """What a measured cell adds to run.json, and its raw records."""

    cell: dict


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
            print(
                f"[{index}/{total}] {label} (ETA {_fmt_eta(eta_s)})", file=self.stream, flush=True
            )

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
                else:
                    tok_s = " warming up"
            el_cell = time.monotonic() - live.started
            eta = max(live.eta_s - el_cell, 0)
            self.stream.write(
                f"\r\033[K[{live.index}/{live.total}] {live.label}:{tok_s}  ETA {_fmt_eta(eta)}"
            )
            self.stream.flush()


def _fmt_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Sweep:
    """A matrix run against one server.

    `Sweep(url, matrix, out=DIR).execute()` measures every planned cell and
    returns 0 (130 when interrupted). `Sweep.run_result()` gives the saved run
    as a `speedmatrix.results.Run`.
    """

    def __init__(
        self,
        url: str,
        matrix,
        out: str | os.PathLike,
        *,
        api_key: str | None = None,
        model: str | None = None,
        overrides: dict | None = None,
        info: dict | None = None,
        progress: bool = True,
        report: bool = True,
        target=None,
        resume_doc: dict | None = None,
        tokenizer=None,
    ):
        self.url = url.rstrip("/")
        self.matrix = matrix
        self.out = Path(out)
        self.api_key = api_key
        self.model = model
        self.overrides = dict(overrides or {})
        self.info = dict(info or {})
        self.report = report
        self.progress = Progress(progress)
        self.target = target
        self.doc: dict = resume_doc or {}
        self.cells: dict[str, dict] = {}
        if resume_doc:
            for c in resume_doc.get("cells", []):
                if c.get("id"):
                    self.cells[c["id"]] = c
        self.interrupted = False
        #: why the server stopped answering mid-sweep (None while it answers)
        self.unreachable: str | None = None
        #: a local tokenizer for exact prompts: an object or a name/path to load
        self.tokenizer = tokenizer
        # Prefill prompts are salted with this process's nonce: a resumed run (same
        # seed in run.json) must not resend a prompt the server may have cached.
        self._nonce = os.urandom(4).hex()
        self._cold_prompts = 0
        self._secrets = [s for s in (api_key,) if s]

    # ------------------------------------------------------------------ API
    def execute(self) -> int:
        """Runs every planned cell not yet in run.json. Returns 0 when the matrix was
        run to its end, 130 when interrupted, 1 when the server stopped answering (the
        cells left are marked `error`, "server unreachable"; `--resume` redoes them)."""
        from speedmatrix.adapters import discover
        from speedmatrix.plan import plan

        self.out.mkdir(parents=True, exist_ok=True)
        tokenizer_name = None
        if isinstance(self.tokenizer, (str, os.PathLike)):
            from speedmatrix.prompts import load_tokenizer

            tokenizer_name = os.fspath(self.tokenizer)  # as given: what a resume needs
            self.tokenizer = load_tokenizer(tokenizer_name)
        if self.target is None:
            self.target = discover(
                self.url, api_key=self.api_key, model=self.model, overrides=self.overrides
            )
        planned = plan(self.matrix, self.target)
        if not self.doc:
            self.doc = {"schema": runfile.SCHEMA, "meta": self._meta(), "cells": []}
        run_meta = self.doc["meta"]["run"]
        run_meta["interrupted"] = False
        run_meta.pop("finished_at", None)
        # The resolved plan ("max" as tokens) is saved before any cell runs, and so are
        # the cells the plan will not run: an interrupted run still shows its whole
        # matrix (the seed's 123K row of over-capacity cells included).
        run_meta["plan"] = _plan_meta(planned, self.matrix)
        if self.tokenizer is not None:
            run_meta["tokenizer"] = tokenizer_name or _tokenizer_name(self.tokenizer)
        self._warn(list(self.target.warnings) + list(planned.warnings))
        for c in planned:
            if not c.runnable and c.id not in self.cells:
                self.cells[c.id] = self._unrun_cell(c).cell
        self._write()

        todo = [c for c in planned if c.runnable and not self._done(c.id)]
        prefill_from_warmup = self._prefill_from_warmup(planned)
        runnable = [c for c in todo if not (c.phase == "prefill" and c.id in prefill_from_warmup)]
        total = len(runnable)
        try:
            for i, cell in enumerate(runnable, 1):
                # A server that went away between two cells is found before this cell
                # spends its window on refused connections.
                if i > 1 and self._server_lost(None):
                    self._mark_unreachable(planned, after=self._label(runnable[i - 2]))
                    break
                eta = self._eta(runnable[i - 1 :])
                self.progress.start_cell(i, total, self._label(cell), self._cell_time(cell), eta)
                if cell.phase == "prefill":
                    outcome = self._measure_prefill(cell)
                else:
                    outcome = self._measure_decode(cell)
                if outcome is None:  # interrupted
                    break
                self.progress.end_cell(self._summary(outcome.cell))
                if self._server_lost(outcome.cell):
                    self._mark_unreachable(planned, after=self._label(cell))
                    break
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            self.progress.close()
            self._finish()
        if self.interrupted:
            return 130
        return 1 if self.unreachable else 0

    def run_result(self):
        from speedmatrix.results import load

        return load(self.out)

    # ------------------------------------------------------------ planning
    def _done(self, cell_id: str) -> bool:
        """The cell is in run.json and is not one to redo (left when the server was lost)."""
        c = self.cells.get(cell_id)
        return c is not None and not c.get("not_run")

    def _prefill_from_warmup(self, planned) -> dict[str, str]:
        """Prefill cell id -> id of the decode cell whose N=1 warm-up measures it.

        Only a decode cell still to run can measure a prefill: when a resumed run
        already has the N=1 cell but not its prefill (stopped between the two), the
        prefill cell is measured on its own."""
        decode_n1 = {
            (c.context, c.repetition): c
            for c in planned
            if c.phase == "decode" and c.concurrency == 1 and c.runnable and not self._done(c.id)
        }
        out = {}
        if self.matrix.prefill_mode == "warmup":
            for c in planned:
                if c.phase == "prefill" and (c.context, c.repetition) in decode_n1:
                    out[c.id] = decode_n1[(c.context, c.repetition)].id
        # the decode cell needs the prefill cell's identity back
        self._warmup_prefill = {v: k for k, v in out.items()}
        self._planned = {c.id: c for c in planned}
        return out

    def _cell_time(self, cell) -> float:
        return float(self.matrix.duration_s) if cell.phase == "decode" else 0.0

    def _eta(self, remaining) -> float:
        rate = 10_000.0  # prompt tok/s assumed until the first prefill is measured
        measured = [
            c.get("prompt_tok_s")
            for c in self.cells.values()
            if c.get("phase") == "prefill" and c.get("prompt_tok_s")
        ]
        if measured:
            rate = float(np.median(measured))
        total = 0.0
        for c in remaining:
            if not c.runnable:
                continue
            if c.phase == "prefill":
                total += c.context / rate + 0.5
            else:
                total += self.matrix.duration_s + c.concurrency * c.context / rate * 0.5 + 0.5
        return total

    @staticmethod
    def _label(cell) -> str:
        if cell.phase == "prefill":
            return f"prefill {cell.label}"
        return f"decode {cell.label} x {cell.concurrency}"

    # ------------------------------------------------------------ measuring
    def _endpoint(self) -> str:
        return self.target.endpoint(self.matrix.api)

    def _spec(
        self,
        concurrency: int,
        bodies: list[bytes],
        warmup: list[bytes],
        duration_s: float,
        max_requests: int = 0,
    ):
        from speedmatrix._native import _core

        spec = _core.CellSpec()
        spec.url = self._endpoint()
        if self.api_key:
            spec.api_key = self.api_key
        spec.api = _core.ApiKind.chat if self.matrix.api == "chat" else _core.ApiKind.completions
        spec.bodies = bodies
        spec.warmup_bodies = warmup
        spec.concurrency = concurrency
        spec.duration_s = float(duration_s)
        spec.max_requests = int(max_requests)
        spec.idle_timeout_s = float(self.matrix.request_idle_timeout_s)
        # Keep the engine's own send stamps when it gives them (the built-in
        # engine does, real servers do not): they let a saved run show how late
        # tokens arrived after they were sent. The decoder reads the field anyway.
        spec.server_stamps = True
        names = self._metric_names()
        if names and self.target.metrics_url:
            spec.metrics_url = self.target.metrics_url
            spec.metric_names = names
            # Request counts add up over ranks; KV usage is a fraction of each
            # rank's own pool: the fullest rank is the one that limits admission
            # (MetricsSpec.reduce, the same rule for one-off probes).
            kv = self.target.metrics.kv_usage
            spec.metric_reduce = ["max" if n == kv else "sum" for n in names]
            spec.metrics_interval_s = 0.25
        return spec

    def _metric_names(self) -> list[str]:
        m = self.target.metrics
        if m is None or not m.available:
            return []
        return [n for n in (m.running, m.waiting, m.kv_usage) if n]

    def _run_spec(self, spec):
        """Runs a cell on a worker thread so Ctrl-C stays responsive; returns
        (result, interrupted)."""
        from speedmatrix._native import _core

        runner = _core.CellRunner(spec)
        self.progress.live.runner = runner
        box: dict = {}
        done = threading.Event()

        def work():
            try:
                box["result"] = runner.run()
            except BaseException as exc:  # noqa: BLE001 - reported below
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=work, name="speedmatrix-cell", daemon=True).start()
        interrupted = False
        # Wait on an Event, not Thread.join: a KeyboardInterrupt inside join()
        # can leave the thread looking finished while it still runs (CPython
        # < 3.13), and the records would be read before they exist.
        while True:
            try:
                if done.wait(0.2):
                    break
            except KeyboardInterrupt:
                interrupted = True
                runner.stop()
        self.progress.live.runner = None
        if "error" in box:
            raise box["error"]
        return box["result"], interrupted

    def _wait_idle(self) -> tuple[bool, float]:
        """Waits until the server reports no running and no waiting requests.
        Returns (idle, seconds waited). Without metrics the server is assumed idle."""
        from speedmatrix.adapters import read_load

        timeout = float(self.matrix.idle_timeout_s)
        start = time.monotonic()
        while True:
            load = read_load(self.target, api_key=self.api_key)
            if load is None:  # no metrics or unreachable: nothing to wait for
                return True, time.monotonic() - start
            running, waiting = load
            if (running or 0) == 0 and (waiting or 0) == 0:
                return True, time.monotonic() - start
            if time.monotonic() - start > timeout:
                return False, time.monotonic() - start
            time.sleep(0.2)

    def _prompts(self, context: int, count: int, repetition: int, *, cold: bool = False):
        """`count` prompts of exactly `context` tokens.

        The decode cells of one context share their prompts (each cell's warm-up warms
        the prefix cache anyway). A prefill measurement (`cold`) gets prompts the server
        has never seen, shared prefix included: a factory of its own, salted with this
        process's nonce and a counter, so that neither an earlier cell (concurrency
        given in descending order), an earlier repetition, nor the part of a run before
        `--resume` sent them, and the prefill is not served from the prefix cache."""
        from speedmatrix.prompts import PromptFactory

        run_seed = self.doc["meta"]["run"]["seed"]
        if cold:
            self._cold_prompts += 1
            seed: int | str = (
                f"{run_seed}/{context}/{repetition}/cold/{self._nonce}/{self._cold_prompts}"
            )
            factory = self._factory(PromptFactory, context, seed)
            return factory.prompts(count)
        key = (context, repetition)
        cache = self.__dict__.setdefault("_prompt_factories", {})
        if key not in cache:
            cache[key] = self._factory(
                PromptFactory, context, hash((run_seed, context, repetition)) & 0xFFFFFFFF
            )
        return cache[key].prompts(count)

    def _prompts_sent(self, context: int, repetition: int) -> bool:
        """Whether the server may have seen the decode prompts of (context, repetition):
        made in this process, or a cell of theirs stored before a `--resume` (any cell
        but those never run: over capacity, or left when the server was lost)."""
        if (context, repetition) in self.__dict__.get("_prompt_factories", {}):
            return True
        return any(
            c.get("phase") == "decode"
            and c.get("context") == context
            and c.get("repetition", 0) == repetition
            and not c.get("not_run")
            and c.get("status") != "over_capacity"
            for c in self.cells.values()
        )

    def _factory(self, factory_cls, context: int, seed: int | str):
        return factory_cls(
            self.target,
            context,
            api=self.matrix.api,
            shared_prefix=self.matrix.shared_prefix_for(context),
            seed=seed,
            tokenizer=self.tokenizer,
            api_key=self.api_key,
        )

    def _bodies(self, prompts, max_tokens: int) -> list[bytes]:
        from speedmatrix.prompts import request_body

        return [
            request_body(self.target, self.matrix.api, p, max_tokens, extra=self.matrix.extra)
            for p in prompts
        ]

    def _cooldown(self) -> None:
        time.sleep(float(self.matrix.prefill_cooldown_s))

    def _measure_prefill(self, cell) -> CellOutcome | None:
        idle, _ = self._wait_idle()
        self._cooldown()
        try:
            prompts = self._prompts(cell.context, 1, cell.repetition, cold=True)
            bodies = self._bodies(prompts, 1)
        except (SpeedmatrixError, ValueError) as exc:
            out = self._prompt_failure(cell, exc)
            self._store(out)
            return out
        spec = self._spec(
            1, bodies, [], duration_s=max(600.0, cell.context / 100.0), max_requests=1
        )
        res, interrupted = self._run_spec(spec)
        if interrupted:
            self.interrupted = True
            return None
        req = res.requests
        rows = np.flatnonzero(req["phase"] == 1)
        out = _with_method(self._prefill_cell(cell, res, rows, idle), prompts)
        self._store(out)
        return out

    def _prefill_cell(self, cell, res, rows, idle: bool, source_id: str | None = None):
        req = res.requests
        base = self._base_cell(cell)
        errors: dict[str, int] = {}
        ttfts = []
        reported = []
        for i in rows:
            if req["outcome"][i] == 3:
                kind = req["error_kind"][i] or "unknown"
                errors[kind] = errors.get(kind, 0) + 1
            elif req["first_token_ns"][i] > 0:
                ttfts.append((req["first_token_ns"][i] - req["sent_ns"][i]) / 1e6)
            if req["prompt_tokens"][i] >= 0:
                reported.append(int(req["prompt_tokens"][i]))
        ttft = float(np.median(ttfts)) if ttfts else None
        base.update(
            {
                "status": "valid" if ttft is not None else "error",
                "prompt_tok_s": cell.context / (ttft / 1000.0) if ttft else None,
                "ttft_ms": ttft,
                "completed": len(ttfts),
                "errors": errors,
                "error_examples": _error_examples(req, rows),
                "errors_total": sum(errors.values()),
                "prompt_tokens": _prompt_check(cell.context, reported),
                "flags": [] if idle else ["busy_at_start"],
            }
        )
        if base["prompt_tokens"]["exact"] is False:
            base["flags"].append("prompt_mismatch")
        if source_id:
            base["measured_in"] = source_id
        if fatal := res.fatal_error:
            base["reason"] = fatal
        if ttft is None and not base.get("reason"):
            base["reason"] = "no first token: " + _error_text(errors, base["error_examples"])
        records = self._save_records(base["id"], res)
        base["records"] = records
        return CellOutcome(base)

    def _measure_decode(self, cell) -> CellOutcome | None:
        idle, _ = self._wait_idle()
        prefill_id = self._warmup_prefill.get(cell.id)
        measures_prefill = bool(prefill_id) and not self._done(prefill_id)
        if measures_prefill:
            self._cooldown()  # this warm-up measures a cold prefill
        n, c = cell.concurrency, cell.context
        try:
            # The context's own prompts serve the prefill measurement while no cell has
            # sent them (the run's seed is new, so neither has an earlier run): then the
            # later cells of this context find their shared prefix cached. Once sent,
            # the measurement needs prompts of its own.
            cold = measures_prefill and self._prompts_sent(c, cell.repetition)
            prompts = self._prompts(c, n, cell.repetition, cold=cold)
            bodies = self._bodies(prompts, self.matrix.max_output)
            warm = self._bodies(prompts, 1) if self.matrix.warmup else []
        except (SpeedmatrixError, ValueError) as exc:
            out = self._prompt_failure(cell, exc)
            self._store(out)
            if measures_prefill:  # its prefill would have come from this warm-up
                self._store(self._prompt_failure(self._planned[prefill_id], exc))
            return out
        spec = self._spec(n, bodies, warm, self.matrix.duration_s)
        res, interrupted = self._run_spec(spec)
        if interrupted:
            self.interrupted = True
            return None
        out = _with_method(self._decode_cell(cell, res, idle), prompts)
        self._store(out)
        if measures_prefill:
            rows = np.flatnonzero(res.requests["phase"] == 0)[:1]
            pcell = self._planned[prefill_id]
            self._store(
                _with_method(self._prefill_cell(pcell, res, rows, idle, source_id=cell.id), prompts)
            )
        return out

    def _decode_cell(self, cell, res, idle: bool) -> CellOutcome:
        from speedmatrix._native import _core

        base = self._base_cell(cell)
        req, ev = res.requests, res.events
        t0, t1 = int(res.window_start_ns), int(res.window_end_ns)
        window = req["phase"] == 1
        errors: dict[str, int] = {}
        for kind, outcome in zip(
            np.asarray(req["error_kind"], dtype=object)[window], req["outcome"][window]
        ):
            if outcome == 3:
                errors[kind or "unknown"] = errors.get(kind or "unknown", 0) + 1
        flags: list[str] = [] if idle else ["busy_at_start"]
        if not self.target.output.forced:
            # the engine may stop a request early at end-of-sequence (TGI, Ollama,
            # generic servers): output lengths, and so the KV load, are not the asked ones
            flags.append("output_not_forced")
        if t0 <= 0 or t1 <= t0:
            # the window never started: the warm-up's failures say why
            errors = errors or _error_counts(req, np.flatnonzero(req["phase"] == 0))
            examples = _error_examples(req, np.flatnonzero(req["outcome"] == 3))
            reason = (
                res.fatal_error
                or "the window never started (every warm-up request failed)"
                + (f": {_error_text(errors, examples)}" if errors else "")
            )
            base.update(
                {
                    "status": "error",
                    "errors": errors,
                    "error_examples": examples,
                    "errors_total": sum(errors.values()),
                    "reason": reason,
                    "flags": flags,
                }
            )
            base["records"] = self._save_records(base["id"], res)
            return CellOutcome(base)

        settle = _first_wave_settled(req, cell.concurrency, t0, t1)
        fig = _core.summarize_cell(req, ev, t0, t1, 1.0, settle)
        server = self._server_view(res, t0, t1, settle)
        reported = [int(x) for x in req["prompt_tokens"][window] if x >= 0]
        ptok = _prompt_check(cell.context, reported)
        base.update(
            {
                "total_tok_s": _finite(fig["total_tok_s"]),
                "per_request_tok_s": _finite(fig["per_request_tok_s"]),
                "ttft_ms": _finite(fig["ttft_ms"]),
                "tbt_ms": _finite(fig["tbt_ms"]),
                "avg_active": _finite(fig["avg_active"]),
                "completed": int(fig["completed"]),
                "output_tokens": int(fig["output_tokens"]),
                "measured_s": _finite(fig["measured_s"]) or 0.0,
                "started": int(fig["started"]),
                "errors": errors,
                "error_examples": _error_examples(
                    req, np.flatnonzero(window & (req["outcome"] == 3))
                ),
                "errors_total": sum(errors.values()),
                "t0_ns": t0,
                "t1_ns": t1,
                "warmup_start_ns": int(res.warmup_start_ns),
                "end_ns": int(res.end_ns),
                "ci": {
                    k: _interval(fig.get(f"{k}_ci"))
                    for k in ("total_tok_s", "per_request_tok_s", "ttft_ms", "tbt_ms")
                },
                "ttft_p90_ms": _finite(fig.get("ttft_p90_ms")),
                "ttft_p99_ms": _finite(fig.get("ttft_p99_ms")),
                "tbt_p90_ms": _finite(fig.get("tbt_p90_ms")),
                "tbt_p99_ms": _finite(fig.get("tbt_p99_ms")),
                "drift": _finite(fig.get("drift")),
                "server": server,
                "prompt_tokens": ptok,
                "client": {"cpu_s": res.client_cpu_s, "loop_lag_max_ms": res.loop_lag_max_ms},
            }
        )
        if fig.get("drifting"):
            flags.append("drift")
        if ptok["exact"] is False:
            flags.append("prompt_mismatch")
        sources = req["token_source"][window]
        if len(sources) and np.any(sources == 1):
            flags.append("estimated_tokens")
        cell_s = (int(res.end_ns) - int(res.warmup_start_ns)) / 1e9  # client CPU covers it all
        if cell_s > 0 and res.client_cpu_s > CLIENT_BOUND_CPU_SHARE * cell_s:
            flags.append("client_bound")
        if (
            server
            and server.get("running_mean") is not None
            and server["running_mean"] > cell.concurrency * 1.1 + 0.5
        ):
            flags.append("server_running_mismatch")
        unserved, unserved_longer = _ttft_unserved(req, t0, t1, base["ttft_ms"])
        base["ttft_unserved"] = unserved
        if unserved_longer and unserved_longer > TTFT_UNSERVED_SHARE * max(int(fig["started"]), 1):
            flags.append("ttft_unserved")
        base["flags"] = flags

        started = max(int(fig["started"]), 1)
        queued_client = _client_queue_signal(req, settle, t1)
        base["ramp_s"] = (settle - t0) / 1e9
        streamed = _first_wave_streamed(req, cell.concurrency)
        base["first_wave_streamed"] = streamed
        if streamed < cell.concurrency or settle - t0 > RAMP_SHARE * (t1 - t0):
            flags.append("long_ramp")
        base["waiting_without_tokens"] = queued_client
        status, reason = "valid", None
        if (
            base["errors_total"] > self.matrix.error_threshold * started
            or base["output_tokens"] == 0
        ):
            status = "error"
            reason = (
                (
                    f"{base['errors_total']} of {started} requests failed: "
                    + _error_text(errors, base["error_examples"])
                )
                if errors
                else "no output tokens in the window"
            )
        elif server and (server.get("waiting_held_mean") or 0) >= QUEUE_GAP_REQUESTS:
            status = "queued"
            reason = (
                f"the server kept {server['waiting_held_mean']:.1f} requests waiting on "
                f"average (up to {server['waiting_max']:g}) once the first wave was "
                "admitted, while it ran no more than before"
            )
        elif (
            not server or server.get("waiting_held_mean") is None
        ) and queued_client > QUEUE_GAP_REQUESTS:
            # No waiting count from the server (no metrics, or metrics without a waiting
            # gauge): the client's view decides.
            status = "queued"
            why = "no server metrics" if not server else "the server reports no waiting count"
            reason = (
                f"on average {queued_client:.1f} requests were in flight without streaming ({why})"
            )
        base["status"] = status
        if reason:
            base["reason"] = reason
        base["records"] = self._save_records(base["id"], res)
        return CellOutcome(base)

    def _server_view(self, res, t0: int, t1: int, settle: int) -> dict | None:
        met = res.metrics
        names = list(met.get("names", []))
        if not names or len(met["t_ns"]) == 0:
            return None
        t = np.asarray(met["t_ns"])
        vals = np.asarray(met["values"], dtype=float).reshape(len(t), len(names))
        inside = (t >= t0) & (t <= t1)
        if not inside.any():
            return None
        m = self.target.metrics
        out: dict = {"samples": int(inside.sum()), "poll_failures": int(met.get("failures", 0))}

        def col(name):
            if name and name in names:
                v = vals[inside, names.index(name)]
                v = v[np.isfinite(v)]
                return v if len(v) else None
            return None

        running, waiting, kv = col(m.running), col(m.waiting), col(m.kv_usage)
        out["running_mean"] = float(running.mean()) if running is not None else None
        out["running_max"] = float(running.max()) if running is not None else None
        out["waiting_max"] = float(waiting.max()) if waiting is not None else None
        out["waiting_mean_settled"] = None
        out["waiting_held_mean"] = None
        if m.waiting and m.waiting in names:
            w_all = vals[:, names.index(m.waiting)]
            r_all = vals[:, names.index(m.running)] if m.running in names else None
            # A burst of N arrivals queues briefly on any server while the first
            # wave is admitted; a server that cannot run N at once keeps some
            # waiting after that. Judge from the samples after the first wave
            # settled (or the window's second half if it never did).
            after = (t >= max(settle, t0)) & (t <= t1)
            if after.sum() < 2 or settle >= t1:
                after = (t >= t0 + (t1 - t0) // 2) & (t <= t1)
            w = w_all[after]
            out["waiting_mean_settled"] = float(np.nanmean(w)) if np.isfinite(w).any() else None
            out["waiting_held_mean"] = _held_waiting(w_all, r_all, inside, after)
        out["kv_usage_max"] = float(kv.max()) if kv is not None else None
        if all(out[k] is None for k in ("running_mean", "waiting_max", "kv_usage_max")):
            return None
        return out

    # ------------------------------------------------------------ cells
    def _base_cell(self, cell) -> dict:
        return {
            "id": cell.id,
            "phase": cell.phase,
            "context": int(cell.context),
            "label": cell.label,
            "concurrency": int(cell.concurrency),
            "repetition": int(cell.repetition),
            "status": None,
            "total_tok_s": None,
            "per_request_tok_s": None,
            "prompt_tok_s": None,
            "ttft_ms": None,
            "tbt_ms": None,
            "avg_active": None,
            "completed": 0,
            "output_tokens": 0,
            "measured_s": 0.0,
            "errors": {},
        }

    def _unrun_cell(self, cell) -> CellOutcome:
        base = self._base_cell(cell)
        base["status"] = cell.status
        if cell.reason:
            base["reason"] = cell.reason
        return CellOutcome(base)

    def _prompt_failure(self, cell, exc: Exception) -> CellOutcome:
        """An `error` cell for a cell whose prompts could not be made (nothing was sent):
        kind `connect` when the server did not answer, else `prompt`."""
        from speedmatrix.http import ConnectError

        kind = "connect" if isinstance(exc, ConnectError) else "prompt"
        message = str(exc)[:ERROR_EXAMPLE_CHARS]
        base = self._base_cell(cell)
        base.update(
            {
                "status": "error",
                "errors": {kind: 1},
                "errors_total": 1,
                "error_examples": {kind: message},
                "flags": [],
                "reason": f"prompts of {cell.context} tokens could not be made: {message}",
            }
        )
        return CellOutcome(base)

    # ------------------------------------------------------------ a lost server
    def _server_lost(self, cell: dict | None) -> bool:
        """Whether the server stopped answering: checked before every cell after the
        first (`cell` None) and after a cell with failed requests. Any HTTP answer to
        GET /v1/models counts (even 404): only a failure to connect is loss."""
        if cell is not None and not cell.get("errors") and cell.get("status") != "error":
            return False
        from speedmatrix.http import ConnectError, HttpClient, HttpError

        client = HttpClient(self.target.url, self.api_key or self.target.api_key, 5.0)
        for attempt in range(REPROBE_TRIES):
            if attempt:
                time.sleep(REPROBE_PAUSE_S)
            try:
                client.request("GET", "/v1/models")
                return False
            except HttpError:
                return False
            except ConnectError as exc:
                self.unreachable = str(exc)
        return True

    def _mark_unreachable(self, planned, after: str) -> None:
        """Every cell still to run becomes `error` ("server unreachable") without
        spending its window; `not_run` lets `--resume` measure it later."""
        left = [c for c in planned if c.runnable and not self._done(c.id)]
        for c in left:
            base = self._base_cell(c)
            base.update(
                {
                    "status": "error",
                    "not_run": SERVER_UNREACHABLE,
                    "flags": [],
                    "reason": f"server unreachable: {self.unreachable}; not run",
                }
            )
            self.cells[c.id] = base
        self._write()
        print(
            f"speedmatrix: error: the server stopped answering after {after} "
            f"({self.unreachable}); {len(left)} cells left are marked error (server "
            f"unreachable); measured cells are in {self.out / 'run.json'}; once the server "
            f"is back, `speedmatrix run --resume {self.out}` measures the rest",
            file=sys.stderr,
            flush=True,
        )

    def _warn(self, warnings: list[str]) -> None:
        """Discovery and plan warnings: kept in meta["warnings"] (a list of strings, each
        once) and shown once at the start of the run unless progress is off (--quiet)."""
        saved = self.doc["meta"].setdefault("warnings", [])
        shown = []
        for w in warnings:
            w = str(w)
            if w not in saved:
                saved.append(w)
            if w not in shown:
                shown.append(w)
        for w in shown:
            self.progress.message(f"speedmatrix: warning: {w}")

    def _save_records(self, cell_id: str, res) -> str:
        met = dict(res.metrics)
        return runfile.save_records(
            self.out, cell_id, res.requests, res.events, met, secrets=self._secrets
        )

    def _store(self, outcome: CellOutcome) -> None:
        from speedmatrix.redact import redact_known

        cell = redact_known(outcome.cell, self._secrets) if self._secrets else outcome.cell
        self.cells[cell["id"]] = cell
        self._write()

    def _write(self) -> None:
        order = {"prefill": 0, "decode": 1}
        self.doc["cells"] = sorted(
            self.cells.values(),
            key=lambda c: (
                order.get(c["phase"], 2),
                c["context"],
                c["concurrency"],
                c.get("repetition", 0),
            ),
        )
        runfile.write_run(self.out, self.doc, secrets=self._secrets)

    def _finish(self) -> None:
        run = self.doc.setdefault("meta", {}).setdefault("run", {})
        run["finished_at"] = _utc_now()
        run["interrupted"] = self.interrupted
        if self.doc.get("cells") is not None:
            self._write()
        if self.report:
            try:
                from speedmatrix.report import write_report

                md, html = write_report(self.out, secrets=self._secrets)
                self.progress.message(f"report: {md} and {html}")
            except Exception as exc:  # noqa: BLE001 - the measurements are safe on disk
                self.progress.message(f"speedmatrix: the report could not be written: {exc}")
        if self.interrupted:  # said even with --quiet: the user needs the way back
            print(
                f"speedmatrix: interrupted; finished cells are in {self.out / 'run.json'}; "
                f"continue with `speedmatrix run --resume {self.out}`",
                file=sys.stderr,
            )

    def _summary(self, cell: dict) -> str:
        if cell["phase"] == "prefill":
            if cell.get("prompt_tok_s"):
                return f"{cell['prompt_tok_s']:,.0f} prompt tok/s, TTFT {cell['ttft_ms']:,.0f} ms"
            return cell["status"]
        if cell.get("total_tok_s") is None:
            return f"{cell['status']}" + (f" ({cell['reason']})" if cell.get("reason") else "")
        s = (
            f"{cell['total_tok_s']:,.1f} tok/s, TTFT {cell['ttft_ms'] or 0:,.0f} ms, "
            f"TBT {cell['tbt_ms'] or 0:.1f} ms"
        )
        if cell["status"] != "valid":
            s += f" [{cell['status']}]"
        return s

    # ------------------------------------------------------------ metadata
    def _meta(self) -> dict:
        from speedmatrix.adapters.base import strip_credentials
        from speedmatrix.hardware import detect_hardware
        from speedmatrix.redact import redact

        t = self.target
        host = urllib.parse.urlsplit(self.url).hostname or ""
        local = host in ("127.0.0.1", "localhost", "::1") or host == socket.gethostname()
        hardware = detect_hardware(
            local=local, given=self.info.get("hardware") or {}, simulated=t.simulated
        )
        engine = t.engine_meta()
        engine.update({k: v for k, v in (self.info.get("engine") or {}).items() if v})
        launch = self.info.get("launch_command")
        matrix = self.matrix.to_dict() if hasattr(self.matrix, "to_dict") else {}
        return {
            "target": {**t.target_meta(self.matrix.api), "url": strip_credentials(t.url)},
            "engine": engine,
            "hardware": hardware,
            "run": {
                "served_model": t.model,
                "revision": self.info.get("revision"),
                "tool": "speedmatrix",
                "tool_version": __version__,
                "decode_test": "Fixed duration",
                "prefill_mode": "Measured during decode warm-up"
                if self.matrix.prefill_mode == "warmup"
                else "Separate cold requests",
                "duration_s": float(self.matrix.duration_s),
                "max_output": int(self.matrix.max_output),
                "started_at": _utc_now(),
                "interrupted": False,
                "launch_command": redact(launch) if launch else None,
                "matrix": matrix,
                "seed": int.from_bytes(os.urandom(4), "little"),
            },
            "capacity": t.capacity_meta(),
            "warnings": list(t.warnings),
            "client": {
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
        }


def _plan_meta(planned, matrix) -> dict:
    """The plan as resolved against the server, for meta["run"]["plan"]: integer
    contexts ("max" resolved), concurrency levels, prefill contexts, what each keyword
    became, and the capacity figures the plan used."""
    keywords: dict[str, dict[str, int]] = {"contexts": {}, "prefill_contexts": {}}
    for c in planned:
        if isinstance(c.spec, str) and c.context:
            keywords["contexts" if c.phase == "decode" else "prefill_contexts"][c.spec] = int(
                c.context
            )
    return {
        "contexts": [int(c) for c in planned.contexts],
        "concurrency": [int(n) for n in matrix.concurrency],
        "prefill_contexts": [int(c) for c in planned.prefill_contexts],
        "keywords": keywords,
        "kv_tokens": planned.kv_tokens,
        "context_length": planned.context_length,
        "max_running": planned.max_running,
        "cells": len(planned),
    }


def _tokenizer_name(tokenizer) -> str:
    for attr in ("name_or_path", "name"):
        name = getattr(tokenizer, attr, None)
        if isinstance(name, str) and name:
            return name
    return type(tokenizer).__name__


def _error_counts(req: dict, rows) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in rows:
        if req["outcome"][i] == 3:
            kind = req["error_kind"][i] or "unknown"
            out[kind] = out.get(kind, 0) + 1
    return out


def _error_examples(req: dict, rows) -> dict[str, str]:
    """The first error message of each kind among `rows` (failed requests), cut to
    ERROR_EXAMPLE_CHARS: what the transport or the server said, never a request body."""
    out: dict[str, str] = {}
    messages = req.get("error_message")
    for i in rows:
        if req["outcome"][i] != 3:
            continue
        kind = req["error_kind"][i] or "unknown"
        if kind not in out:
            text = str(messages[i]) if messages is not None else ""
            out[kind] = text[:ERROR_EXAMPLE_CHARS]
    return out


def _error_text(errors: dict[str, int], examples: dict[str, str]) -> str:
    """ "http_500 x4, connect x1" and the first message of the most frequent kind."""
    text = ", ".join(f"{k} x{v}" for k, v in sorted(errors.items()))
    if errors:
        top = max(sorted(errors), key=lambda k: errors[k])
        if examples.get(top):
            text += f" ({top}: {examples[top]})"
    return text


def _with_method(outcome: CellOutcome, prompts) -> CellOutcome:
    """Records how the cell's prompts were made exact (token_ids, tokenizer, tokenize,
    usage) beside the prompt-token check."""
    check = outcome.cell.get("prompt_tokens")
    if isinstance(check, dict) and prompts:
        check["method"] = prompts[0].method
    return outcome


def _prompt_check(asked: int, reported: list[int]) -> dict:
    if not reported:
        return {"asked": int(asked), "reported_min": None, "reported_max": None, "exact": None}
    lo, hi = min(reported), max(reported)
    return {
        "asked": int(asked),
        "reported_min": lo,
        "reported_max": hi,
        "exact": bool(lo == asked and hi == asked),
    }


def _first_wave_settled(req: dict, n: int, t0: int, t1: int) -> int:
    """When the window's first N requests had all received their first token;
    the latest first token among them when some never did (those then count as
    waiting for the rest of the window); t1 when none streamed."""
    rows = np.flatnonzero(req["phase"] == 1)[:n]
    first = req["first_token_ns"][rows].astype(np.int64)
    got = first[first > 0]
    if len(got) == 0:
        return t1
    return int(min(max(got.max(), t0), t1))


def _first_wave_streamed(req: dict, n: int) -> int:
    """How many of the window's first N requests received a first token."""
    rows = np.flatnonzero(req["phase"] == 1)[:n]
    return int(np.count_nonzero(req["first_token_ns"][rows] > 0))


def _ttft_unserved(req: dict, t0: int, t1: int, ttft_ms: float | None) -> tuple[int, int]:
    """Window requests sent in [t0, t1] that had no first token by t1 and did not fail:
    (all of them, those that waited longer than `ttft_ms`). The second are requests
    whose TTFT is known to exceed the median that leaves them out."""
    sent = req["sent_ns"]
    first = req["first_token_ns"]
    rows = np.flatnonzero((req["phase"] == 1) & (sent >= t0) & (sent <= t1) & (req["outcome"] != 3))
    unserved = rows[(first[rows] < 0) | (first[rows] > t1)]
    if ttft_ms is None:
        return len(unserved), len(unserved)
    longer = np.count_nonzero((t1 - sent[unserved]) / 1e6 > ttft_ms)
    return len(unserved), int(longer)


def _held_waiting(
    waiting: np.ndarray, running: np.ndarray | None, inside: np.ndarray, judged: np.ndarray
) -> float | None:
    """Mean over the `judged` samples of the requests the server kept waiting.

    A sample's waiting requests count as held when the server was not admitting:
    its running count was no higher than at an earlier sample of the window (a
    server still taking in the first wave reaches a new high at every sample,
    and the request it is about to admit shows as waiting for a moment). A held
    sample counts only next to another held one: a server that cannot run N at
    once keeps requests waiting from sample to sample, while a request handed to
    the scheduler between two steps is seen once at most."""
    idx = np.flatnonzero(inside)
    if len(idx) == 0 or not judged.any():
        return None
    w = np.nan_to_num(waiting[idx], nan=0.0)
    held = w > 0
    if running is not None:
        r = running[idx]
        prior_max = np.maximum.accumulate(np.where(np.isfinite(r), r, -np.inf))
        prior_max = np.concatenate(([-np.inf], prior_max[:-1]))
        held &= ~(np.isfinite(r) & (r > prior_max))
    pair = np.zeros_like(held)
    pair[1:] |= held[1:] & held[:-1]
    pair[:-1] |= held[:-1] & held[1:]
    sel = judged[idx]
    return float(np.mean(np.where(pair, w, 0.0)[sel])) if sel.any() else None


def _client_queue_signal(req: dict, start: int, t1: int) -> float:
    """Time-weighted mean number of window requests that were in flight but not
    streaming, over [start, t1] (start = when the first wave settled). A server
    that runs every request at once streams all of them; one that queues holds
    some without tokens for long stretches."""
    window = req["phase"] == 1
    sent = req["sent_ns"][window].astype(np.int64)
    first = req["first_token_ns"][window].astype(np.int64)
    done = req["done_ns"][window].astype(np.int64)
    if len(sent) == 0 or start >= t1:
        return 0.0
    end = np.where(done > 0, done, t1)
    wait_end = np.where(first > 0, np.minimum(first, end), end)
    a = np.clip(sent, start, t1)
    b = np.clip(wait_end, start, t1)
    return float(np.sum(np.maximum(b - a, 0)) / (t1 - start))


def run(url: str, matrix, out: str | os.PathLike | None = None, **kwargs):
    """Measures `matrix` against the server at `url` and returns the saved run
    (`speedmatrix.results.Run`). `out` defaults to a new temporary folder. Keyword
    arguments are Sweep's: api_key, model, overrides, info, progress, report, target,
    tokenizer (a local tokenizer: `callable(text) -> int | list`, an object with
    `encode`, or a Hugging Face name/path loaded with `transformers`/`tokenizers`)."""
    import tempfile

    if out is None:
        out = tempfile.mkdtemp(prefix="speedmatrix-")
    sweep = Sweep(url, matrix, out, **kwargs)
    code = sweep.execute()
    if code == 130:
        raise KeyboardInterrupt
    return sweep.run_result()


def resume(
    out: str | os.PathLike,
    *,
    api_key: str | None = None,
    progress: bool = True,
    report: bool = True,
    tokenizer=None,
) -> int:
    """Continues the interrupted run saved in `out`: cells already in run.json are kept
    (those left unrun when the server stopped answering are measured now)."""
    from speedmatrix.matrix import Matrix

    out = Path(out)
    try:
        doc = runfile.read_run(out)
    except (FileNotFoundError, ValueError) as exc:
        raise SpeedmatrixError(f"cannot resume {out}: {exc}") from exc
    meta = doc["meta"]
    matrix = Matrix.from_dict(meta["run"]["matrix"])
    given = {
        k: v["value"]
        for k, v in meta.get("capacity", {}).items()
        if isinstance(v, dict) and v.get("source") == "given"
    }
    sweep = Sweep(
        meta["target"]["url"],
        matrix,
        out,
        api_key=api_key,
        model=meta["target"].get("model"),
        overrides=given,
        progress=progress,
        report=report,
        resume_doc=doc,
        tokenizer=tokenizer,
    )
    return sweep.execute()
