"""Running a matrix: the orchestration of one sweep.

One `Sweep` measures one server with one `Matrix` (DESIGN.md, "Measurement
definitions"); per cell: plan -> prompts -> cell spec -> core (`_core.CellRunner`) ->
records (`speedmatrix.records.Records`) -> verdict (`speedmatrix.verdict`, pure) ->
store (`speedmatrix.runfile`). The terminal display is `speedmatrix.progress`, the run
metadata `speedmatrix.runmeta`. What it does:

* the target is probed once (`speedmatrix.adapters.discover`), the cells are
  planned (`speedmatrix.plan.plan`: over-capacity cells are never run);
* before every cell the server must be seen idle; a cell that starts on a busy
  server is flagged `busy_at_start`;
* a decode cell warms the prefix cache with its N prompts (max_tokens=1), then
  measures a closed-loop window of D seconds; at its end everything in flight is
  cancelled. The prefill figure of context C is the cold TTFT of the N=1 warm-up
  ("measured during decode warm-up"); contexts without such a cell get a
  standalone prefill cell (one cold request per repetition);
* a cell's figures, status and flags come from its raw records through
  `speedmatrix.verdict`, the same functions that recompute them from a saved run
  (`speedmatrix recompute`);
* `run.json` is rewritten atomically after every cell, so a crash or Ctrl-C loses
  at most the cell in progress, and `--resume` continues without redoing cells;
  the resolved plan (meta.run.plan) and the cells it will not run are written
  before the first cell;
* a cell whose prompts cannot be made is an `error` cell and the sweep goes on;
  before every cell after the first and after a cell with failed requests the
  server is asked whether it still answers; when it does not, the cells left are
  marked `error` ("server unreachable", `not_run`: `--resume` measures them) instead
  of each spending its window.

Over 500 lines: the orchestration of one cell reads best in one place (measuring,
prompts, the idle wait, a lost server, storing); the rules and the display are not here.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speedmatrix import runfile, verdict
from speedmatrix.errors import SpeedmatrixError, clip
from speedmatrix.matrix import Matrix
from speedmatrix.progress import Progress
from speedmatrix.records import Records
from speedmatrix.report.terminal import cell_summary
from speedmatrix.runmeta import plan_meta, run_meta, tokenizer_name, utc_now, verdict_meta
from speedmatrix.verdict import EngineFacts, Rules

if TYPE_CHECKING:
    from speedmatrix.results import Run

# After a cell with failed requests the server is asked whether it still answers:
# this many tries, this far apart (a refused connection fails at once).
REPROBE_TRIES = 3
REPROBE_PAUSE_S = 0.5
#: the longest the /metrics read before a cell may take (the idle check)
IDLE_READ_TIMEOUT_S = 2.0
#: a wait for an idle server this long is said on the terminal; a gauge stuck through a
#: whole wait is waited for only this long before the later cells
IDLE_SAY_AFTER_S = 5.0
#: statuses of saved cells that --resume keeps; every other cell is measured again
KEPT_ON_RESUME = ("valid", "queued", "over_capacity")
#: `not_run` of the cells left when the server stopped answering; `--resume` redoes them
SERVER_UNREACHABLE = "server_unreachable"


@dataclass
class CellOutcome:
    """What a measured cell adds to run.json."""

    cell: dict


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
        probe_running: bool = True,
        client=None,
        force: bool = False,
    ):
        from speedmatrix.adapters import strip_credentials
        from speedmatrix.http import ClientConfig, url_credentials

        if client is None and target is not None:
            client = target.client_config
        #: how every request reaches the server (discovery, prompts, the core's streams)
        self.client: ClientConfig = client or ClientConfig.make(url, api_key)
        if api_key and api_key != self.client.api_key:
            self.client = self.client.replace(api_key=api_key)
        if self.client.basic_auth is None and url_credentials(url):
            self.client = self.client.replace(basic_auth=url_credentials(url))
        if target is not None:
            target.with_client(self.client)
        self.url = strip_credentials(url).rstrip("/")  # credentials live in self.client only
        #: a resume continues on a server whose identity or limits changed (recorded)
        self.force = force
        #: a short load probe may learn the running cap where the server does not say it
        self.probe_running = probe_running
        self.matrix = matrix
        self.out = Path(out)
        self.api_key = self.client.api_key
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
        #: notes of the cell being measured (the wait before it), saved in its ``notes``
        self._cell_notes: list[str] = []
        #: (running, waiting) of a gauge that never read idle through a whole wait
        self._stuck_load: tuple | None = None
        self._secrets = self.client.secrets
        self.progress.secrets = self._secrets  # every line shown is redacted too
        self.facts = EngineFacts()
        self.rules = Rules(error_threshold=float(matrix.error_threshold))

    # ------------------------------------------------------------------ API
    def execute(self) -> int:
        """Runs every planned cell not yet in run.json. Returns 0 when the matrix was
        run to its end, 130 when interrupted, 1 when the server stopped answering (the
        cells left are marked `error`, "server unreachable"; `--resume` redoes them).

        The run folder is locked for the run's life (``runfile.run_lock``): a second run
        into it fails at once, naming this one, and writes nothing."""
        with runfile.run_lock(self.out, "run --resume" if self.doc else "run"):
            if not self.doc and (self.out / runfile.RUN_FILE).exists():
                # checked under the lock: two runs started together cannot both find it absent
                raise SpeedmatrixError(
                    f"--out {self.out} holds another run; continue it with --resume "
                    f"{self.out}, or choose another folder"
                )
            return self._execute()

    def _execute(self) -> int:
        from speedmatrix.adapters import discover
        from speedmatrix.adapters.running import plan_learning_running

        stale = runfile.clean_stale_temp(self.out)  # left by a writer killed with -9
        if stale:
            self.progress.message(
                f"speedmatrix: removed {len(stale)} temporary file(s) an interrupted write left "
                f"in {self.out} ({clip(', '.join(stale), 200)})"
            )
        given_tokenizer = None
        if isinstance(self.tokenizer, (str, os.PathLike)):
            from speedmatrix.prompts import load_tokenizer

            given_tokenizer = os.fspath(self.tokenizer)  # as given: what a resume needs
            self.tokenizer = load_tokenizer(given_tokenizer)
        if self.target is None:
            self.target = discover(
                self.url, model=self.model, overrides=self.overrides, client=self.client
            )
        if self.doc:
            self._check_same_server()
        # the running cap vLLM does not publish: launch command, else a load probe
        planned = plan_learning_running(
            self.matrix, self.target, self.info.get("launch_command"), self.probe_running
        )
        self._begin(planned, given_tokenizer)

        todo = [c for c in planned if c.runnable and not self._done(c.id)]
        prefill_from_warmup = self._prefill_from_warmup(planned)
        runnable = [c for c in todo if not (c.phase == "prefill" and c.id in prefill_from_warmup)]
        total = len(runnable)
        self.progress.plan(planned, self.cells)
        try:
            for i, cell in enumerate(runnable, 1):
                # A server that went away between two cells is found before this cell
                # spends its window on refused connections.
                if i > 1 and self._server_lost(None):
                    self._mark_unreachable(planned, after=self._label(runnable[i - 2]))
                    break
                times = self._eta(runnable[i - 1 :])
                self.progress.start_cell(
                    i,
                    total,
                    self._label(cell),
                    self._cell_time(cell),
                    sum(times),
                    cell_s=times[0],
                    key=(cell.context, cell.concurrency) if cell.phase == "decode" else None,
                )
                if cell.phase == "prefill":
                    outcome = self._measure_prefill(cell)
                else:
                    outcome = self._measure_decode(cell)
                if outcome is None:  # interrupted
                    break
                self.progress.end_cell(self._summary(outcome.cell), outcome.cell)
                if self._server_lost(outcome.cell):
                    self._mark_unreachable(planned, after=self._label(cell))
                    break
            if self.matrix.search and not self.interrupted and not self.unreachable:
                self._search(planned, done=total)
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            self.progress.close()
            self._finish()
        if self.interrupted:
            return 130
        return 1 if self.unreachable else 0

    def _check_same_server(self) -> None:
        """A resumed run continues only on the server it measured: its engine, version,
        model and limits as saved. Otherwise one line naming what changed, before anything
        is written; with --force the difference goes into the run's warnings."""
        from speedmatrix.runmeta import server_changes

        changes = server_changes(self.doc.get("meta") or {}, self.target)
        if not changes:
            return
        what = "; ".join(changes[:6]) + (
            f"; and {len(changes) - 6} more" if len(changes) > 6 else ""
        )
        if not self.force:
            raise SpeedmatrixError(
                f"--resume {self.out}: the server is not the one this run measured ({what}); "
                "measure it into a new --out, or add --force to continue and record the change"
            )
        self.doc.setdefault("meta", {}).setdefault("warnings", []).append(
            f"resumed at {utc_now()} on a server with other settings (--force): {what}"
        )

    def _search(self, planned, done: int) -> None:
        """Per context, the largest load meeting the SLO (`speedmatrix.slo.search`):
        measures only the cells the bracket-and-bisect needs, each stored like a grid
        cell; the answer goes to meta.run.search. Cells already in run.json (a resumed
        run) are not measured again."""
        from speedmatrix import slo
        from speedmatrix.plan import search_cell

        m = self.matrix
        by_rate = m.search == "rate"
        start = float(m.request_rates[0] if by_rate else m.concurrency[0])
        answers = self.doc["meta"]["run"].setdefault("search", {})
        count = [done]

        def measure(context: int, load: float) -> float:
            cell = search_cell(m, planned, context, load)
            if not cell.runnable:
                if cell.id not in self.cells:
                    self.cells[cell.id] = self._unrun_cell(cell).cell
                    self._write()
                return 0.0  # over capacity or does not fit: the load fails
            if not self._done(cell.id):
                if count[0] > 0 and self._server_lost(None):
                    raise _Stop
                count[0] += 1
                self.progress.start_cell(
                    count[0], done + SEARCH_MAX_CELLS * len(planned.contexts),
                    self._label(cell), self._cell_time(cell), 0.0,
                )  # fmt: skip
                outcome = self._measure_decode(cell)
                if outcome is None:
                    raise _Stop
                self.progress.end_cell(self._summary(outcome.cell))
                if self._server_lost(outcome.cell):
                    raise _Stop
            att = (self.cells[cell.id].get("slo") or {}).get("attainment")
            return float(att) if att is not None else 0.0

        for context in planned.contexts:

            def measure_here(x: float, c: int = context) -> float:
                return measure(c, x)

            try:
                found = slo.search(
                    measure_here,
                    start,
                    m.attainment,
                    integer=not by_rate,
                    max_cells=SEARCH_MAX_CELLS,
                    lowest=1 if not by_rate else start / 64,
                )
            except _Stop:
                break
            found["by"] = m.search
            answers[str(context)] = found
            self._write()

    def _begin(self, planned, given_tokenizer: str | None) -> None:
        """run.json before the first cell: the run's meta (a new run's, or a resumed one's
        kept), the resolved plan, the cells the plan will not run; the plan's warnings."""
        self.facts = EngineFacts.of_target(self.target)
        roles = {
            "running": self.facts.metric_running,
            "waiting": self.facts.metric_waiting,
            "kv_usage": self.facts.metric_kv_usage,
        }
        self.progress.metric_roles = {k: v for k, v in roles.items() if v}
        self.rules = Rules(error_threshold=float(self.matrix.error_threshold))
        if not self.doc:
            meta = run_meta(self.url, self.target, self.matrix, self.info, self.rules)
            self.doc = {"schema": runfile.SCHEMA, "meta": meta, "cells": []}
        # a run saved before verdict facts were: the cells measured from now on say theirs
        self.doc["meta"].setdefault("verdict", verdict_meta(self.facts, self.rules))
        run = self.doc["meta"]["run"]
        run["interrupted"] = False
        run.pop("finished_at", None)
        # The resolved plan ("max" as tokens) is saved before any cell runs, and so are
        # the cells the plan will not run: an interrupted run still shows its whole
        # matrix (the seed's 123K row of over-capacity cells included).
        run["plan"] = plan_meta(planned, self.matrix)
        if self.tokenizer is not None:
            run["tokenizer"] = given_tokenizer or tokenizer_name(self.tokenizer)
        self._warn(list(self.target.warnings) + list(planned.warnings))
        for c in planned:
            if not c.runnable and c.id not in self.cells:
                self.cells[c.id] = self._unrun_cell(c).cell
        self._write()

    def run_result(self) -> Run:
        from speedmatrix.results import load

        return load(self.out)

    # ------------------------------------------------------------ planning
    def _done(self, cell_id: str) -> bool:
        """The cell is in run.json with a measurement to keep (valid, queued, over
        capacity); any other (an error, a cell interrupted or left when the server was
        lost) is measured again by --resume."""
        c = self.cells.get(cell_id)
        return c is not None and not c.get("not_run") and c.get("status") in KEPT_ON_RESUME

    def _prefill_from_warmup(self, planned) -> dict[str, str]:
        """Prefill cell id -> id of the decode cell whose N=1 warm-up measures it.

        Only a decode cell still to run can measure a prefill: when a resumed run
        already has the N=1 cell but not its prefill (stopped between the two), the
        prefill cell is measured on its own."""
        decode_n1 = {
            (c.context, c.repetition): c
            for c in planned
            if c.phase == "decode"
            and c.concurrency == 1
            and c.rate_per_s is None
            and c.runnable
            and not self._done(c.id)
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

    @staticmethod
    def _cell_time(cell) -> float:
        return float(cell.duration_s) if cell.phase == "decode" else 0.0

    def _prompt_rate(self) -> float:
        """Prompt tok/s: the median measured prefill so far, else a cautious guess."""
        measured: list[float] = [
            float(c["prompt_tok_s"])
            for c in self.cells.values()
            if c.get("phase") == "prefill" and c.get("prompt_tok_s")
        ]
        return float(np.median(measured)) if measured else 10_000.0

    def _eta(self, remaining) -> list[float]:
        """Seconds each of the ``remaining`` cells will take (dryrun.estimate_s): warm-ups
        and prefill at the median prefill rate measured so far, prompts already sent
        counted as sent."""
        from speedmatrix.dryrun import estimate_cells_s

        measured: list[float] = [
            c["prompt_tok_s"]
            for c in self.cells.values()
            if c.get("phase") == "prefill" and c.get("prompt_tok_s")
        ]
        rate = float(np.median(measured)) if measured else None
        sent: dict[tuple[int, int], int] = {}
        for c in self.cells.values():  # cells that sent their prompts (see _prompts_sent)
            if (
                c.get("phase") == "decode"
                and not c.get("not_run")
                and c.get("status") != "over_capacity"
            ):
                key = (c["context"], c.get("repetition", 0))
                sent[key] = max(sent.get(key, 0), int(c["concurrency"]))
        return estimate_cells_s(remaining, self.matrix, prefill_tok_s=rate, sent=sent)

    @staticmethod
    def _label(cell) -> str:
        if cell.phase == "prefill":
            return f"prefill {cell.label}"
        if cell.rate_per_s is not None:
            return f"decode {cell.label} @ {cell.rate_per_s:g}/s"
        return f"decode {cell.label} x {cell.concurrency}"

    # ------------------------------------------------------------ measuring
    def _spec(
        self,
        cell,
        concurrency: int,
        bodies: list[bytes],
        warmup: list[bytes],
        duration_s: float,
        max_requests: int = 0,
    ):
        from speedmatrix._native import _core

        spec = _core.CellSpec()
        spec.url = self.target.endpoint(cell.api)
        spec.api = _core.ApiKind.chat if cell.api == "chat" else _core.ApiKind.completions
        spec.bodies = bodies
        spec.warmup_bodies = warmup
        spec.concurrency = concurrency
        spec.duration_s = float(duration_s)
        spec.max_requests = int(max_requests)
        spec.idle_timeout_s = float(cell.request_idle_timeout_s)
        # Keep the engine's own send stamps when it gives them (the built-in
        # engine does, real servers do not): they let a saved run show how late
        # tokens arrived after they were sent. The decoder reads the field anyway.
        spec.server_stamps = True
        # the key, Basic auth and TLS choice discovery used (one ClientConfig for all)
        self.target.client_config.apply(spec)
        names = self.facts.metric_names()
        if names and self.target.metrics_url:
            spec.metrics_url = self.target.metrics_url
            spec.metric_names = names
            spec.metric_reduce = self.target.metrics.reductions(names)
            spec.metrics_interval_s = 0.25
        return spec

    def _decode_bounds(self, spec, cell) -> None:
        """The decode cell's bounds and its window rules (docs/metrics.md): a warm-up try
        and the ramp are bounded by the expected time to prefill the first wave (N x C at
        the measured prompt rate) four times over, the warm-up at 30-600 s, the ramp at
        30 s to the matrix's ramp_cap_s; the stall rule and the precision stop as the
        cell says, a silence shared by every stream spared up to four prefills' time."""
        n, context = cell.concurrency, cell.context
        expected_s = n * context / self._prompt_rate()
        spec.warmup_timeout_s = min(600.0, max(30.0, 4 * expected_s + 10))
        spec.warmup_retries = 1
        spec.steady_window = True
        spec.ramp_cap_s = min(float(cell.ramp_cap_s), max(30.0, 4 * expected_s))
        spec.stall_min_s = float(cell.stall_min_s)
        spec.stall_gap_factor = float(cell.stall_gap_factor)
        # A silence all streams share is the server's pause, e.g. a refill's prefill that
        # blocks decode on an engine without chunked prefill or prefix cache: spared for up
        # to four uncached prefills of one prompt before the stall rule cuts it.
        spec.stall_pause_cap_s = min(
            spec.ramp_cap_s, max(float(cell.stall_min_s), 4 * context / self._prompt_rate())
        )
        spec.precision = float(cell.precision)
        spec.min_duration_s = min(float(cell.min_duration_s), float(spec.duration_s))

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
        res = box["result"]
        notes = [getattr(res, k, "") for k in ("events_note", "requests_note")]
        if any(notes):  # the spill directory was unusable: the cell is whole, its memory unbounded
            self._warn([n for n in notes if n])
        return box["result"], interrupted

    def _wait_idle(self) -> tuple[bool, float]:
        """Waits until the server reports no running and no waiting requests.
        Returns (idle, seconds waited). Without metrics the server is assumed idle.

        Nothing here is silent: a /metrics that does not answer (within
        IDLE_READ_TIMEOUT_S) or reads NaN leaves the load unknown, a wait past
        IDLE_SAY_AFTER_S is said on the terminal, and each ends in a note of the cell. A
        gauge that stayed at the same non-zero value through a whole wait (stuck, or another
        client's load) is waited for only IDLE_SAY_AFTER_S before the later cells."""
        import math

        from speedmatrix.http import ConnectError, HttpError

        self._cell_notes = []
        if self.target.metrics_url is None:
            return True, 0.0
        timeout = float(self.matrix.idle_timeout_s)
        stuck = self._stuck_load
        start = time.monotonic()
        client = self.target.client(IDLE_READ_TIMEOUT_S)
        said = False
        while True:
            waited = time.monotonic() - start
            try:
                load = self.target.read_load(client)
            except (HttpError, ConnectError, ValueError) as exc:
                self._note(
                    f"the server's load before this cell is unknown: {self.target.metrics.path} "
                    f"did not answer ({clip(exc, 160)})"
                )
                return True, waited
            if load is None:
                return True, waited
            now = (load.get("running"), load.get("waiting"))
            if any(isinstance(v, float) and math.isnan(v) for v in now):
                self._note(
                    f"the server's load before this cell is unknown: its gauges read "
                    f"running {now[0]}, waiting {now[1]}"
                )
                return True, waited
            if (now[0] or 0) == 0 and (now[1] or 0) == 0:
                self._stuck_load = None
                if said:
                    self._note(f"waited {waited:.0f} s for the server to be idle")
                return True, waited
            bound = min(timeout, IDLE_SAY_AFTER_S) if stuck == now else timeout
            if waited > bound:
                self._stuck_load = now
                again = " again (as before the last cell)" if stuck == now else ""
                self._note(
                    f"the server did not report idle{again} in {waited:.0f} s (running {now[0]}, "
                    f"waiting {now[1]}: a stuck gauge or another client's load); measured anyway"
                )
                return False, waited
            if not said and waited >= IDLE_SAY_AFTER_S:
                said = True
                self.progress.message(
                    f"speedmatrix: waiting up to {bound:g} s for the server to be idle (running "
                    f"{now[0]}, waiting {now[1]})"
                )
            time.sleep(0.2)

    def _note(self, text: str) -> None:
        """A note of the cell about to run: shown now and saved in the cell's ``notes``."""
        self._cell_notes.append(text)
        self.progress.message(f"speedmatrix: note: {text}")

    def _prompts(self, context: int, count: int, repetition: int, *, cold: bool = False, cell):
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
            factory = self._factory(PromptFactory, cell, seed)
            return factory.prompts(count)
        key = (context, repetition)
        cache = self.__dict__.setdefault("_prompt_factories", {})
        if key not in cache:
            cache[key] = self._factory(
                PromptFactory, cell, hash((run_seed, context, repetition)) & 0xFFFFFFFF
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

    def _factory(self, factory_cls, cell, seed: int | str):
        return factory_cls(
            self.target,
            cell.context,
            api=cell.api,
            shared_prefix=cell.shared_prefix,
            seed=seed,
            tokenizer=self.tokenizer,
        )

    def _bodies(self, cell, prompts, max_tokens: int) -> list[bytes]:
        from speedmatrix.prompts import request_body

        return [
            request_body(self.target, cell.api, p, max_tokens, extra=cell.extra) for p in prompts
        ]

    def _file_bodies(self, cell) -> list[bytes]:
        """The bodies of a workload file's requests (`speedmatrix.workload`), in file order,
        each with its own max_tokens (else the cell's); loaded once per run."""
        from speedmatrix.prompts import request_body
        from speedmatrix.workload import load_prompts

        cache = self.__dict__.setdefault("_file_prompts", {})
        if cell.prompts_file not in cache:
            cache[cell.prompts_file] = load_prompts(cell.prompts_file)
        return [
            request_body(
                self.target,
                cell.api,
                p.payload,
                p.max_tokens or cell.max_output,
                extra=cell.extra,
            )
            for p in cache[cell.prompts_file]
        ]

    def _cooldown(self) -> None:
        time.sleep(float(self.matrix.prefill_cooldown_s))

    def _measure_prefill(self, cell) -> CellOutcome | None:
        idle, _ = self._wait_idle()
        self._cooldown()
        try:
            prompts = self._prompts(cell.context, 1, cell.repetition, cold=True, cell=cell)
            bodies = self._bodies(cell, prompts, 1)
        except (SpeedmatrixError, ValueError) as exc:
            out = self._prompt_failure(cell, exc)
            self._store(out)
            return out
        spec = self._spec(
            cell, 1, bodies, [], duration_s=cell.duration_s, max_requests=cell.max_requests
        )
        res, interrupted = self._run_spec(spec)
        if interrupted:
            self.interrupted = True
            return None
        records = Records.from_result(res)
        return self._store_measured(
            verdict.prefill_cell(cell, records, idle=idle), records, prompts
        )

    def _measure_decode(self, cell) -> CellOutcome | None:
        idle, _ = self._wait_idle()
        prefill_id = self._warmup_prefill.get(cell.id, "")
        measures_prefill = bool(prefill_id) and not self._done(prefill_id)
        if measures_prefill:
            self._cooldown()  # this warm-up measures a cold prefill
        n, c = cell.concurrency, cell.context
        try:
            # The context's own prompts serve the prefill measurement while no cell has
            # sent them (the run's seed is new, so neither has an earlier run): then the
            # later cells of this context find their shared prefix cached. Once sent,
            # the measurement needs prompts of its own.
            # An open-loop cell's arrivals must each pay their prefill: prompts of its own.
            cold = cell.rate_per_s is not None or (
                measures_prefill and self._prompts_sent(c, cell.repetition)
            )
            if cell.prompts_file:
                prompts, bodies, warm = [], self._file_bodies(cell), []
            else:
                prompts = self._prompts(c, cell.prompt_count, cell.repetition, cold=cold, cell=cell)
                bodies = self._bodies(cell, prompts, cell.max_output)
                warm = self._bodies(cell, prompts, 1) if cell.warmup else []
        except (SpeedmatrixError, ValueError) as exc:
            out = self._prompt_failure(cell, exc)
            self._store(out)
            if measures_prefill:  # its prefill would have come from this warm-up
                self._store(self._prompt_failure(self._planned[prefill_id], exc))
            return out
        spec = self._spec(
            cell, max(n, 1), bodies, warm, cell.duration_s, max_requests=cell.max_requests
        )
        if cell.rate_per_s is not None:
            _open_loop_spec(spec, cell)
        else:
            self._decode_bounds(spec, cell)
        res, interrupted = self._run_spec(spec)
        if interrupted:
            self.interrupted = True
            return None
        records = Records.from_result(res)
        cell_dict = verdict.decode_cell(
            cell,
            records,
            self.facts,
            self.rules,
            idle=idle,
            percentiles=cell.percentiles,
            slo_targets=cell.slo,
        )
        out = self._store_measured(cell_dict, records, prompts)
        if measures_prefill:
            pcell = self._planned[prefill_id]
            pdict = verdict.prefill_cell(pcell, records, idle=idle, measured_in=cell.id)
            self._store_measured(pdict, records, prompts)
        return out

    def _store_measured(self, cell: dict, records: Records, prompts) -> CellOutcome:
        """Saves a measured cell's records, adds their path and how its prompts were made
        exact (token_ids, tokenizer, tokenize, usage) beside the prompt-token check, and
        stores the cell."""
        check = cell.get("prompt_tokens")
        if isinstance(check, dict) and prompts:
            check["method"] = prompts[0].method
        cell["records"] = self._save_records(cell["id"], records)
        if self._cell_notes:  # what the wait before it found (speedmatrix.sweep._wait_idle)
            cell["notes"] = list(self._cell_notes)
        out = CellOutcome(cell)
        self._store(out)
        return out

    # ------------------------------------------------------------ cells
    def _unrun_cell(self, cell) -> CellOutcome:
        return CellOutcome(verdict.unrun_cell(cell, cell.status, cell.reason))

    def _prompt_failure(self, cell, exc: Exception) -> CellOutcome:
        """An `error` cell for a cell whose prompts could not be made (nothing was sent):
        kind `connect` when the server did not answer, else `prompt`."""
        from speedmatrix.http import ConnectError

        kind = "connect" if isinstance(exc, ConnectError) else "prompt"
        return CellOutcome(verdict.prompt_failure_cell(cell, kind, str(exc)))

    # ------------------------------------------------------------ a lost server
    def _server_lost(self, cell: dict | None) -> bool:
        """Whether the server stopped answering: checked before every cell after the
        first (`cell` None) and after a cell with failed requests. Any HTTP answer to
        GET /v1/models counts (even 404): only a failure to connect is loss."""
        if cell is not None and not cell.get("errors") and cell.get("status") != "error":
            return False
        from speedmatrix.http import ConnectError, HttpError

        client = self.target.client(5.0)
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
            base = verdict.base_cell(c)
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
        for w in shown:  # a server's text, bounded on the terminal (run.json keeps it whole)
            self.progress.message(f"speedmatrix: warning: {clip(w, 500)}")

    def _save_records(self, cell_id: str, records: Records) -> str:
        return runfile.save_records(
            self.out,
            cell_id,
            records.requests,
            records.events,
            dict(records.metrics),
            secrets=self._secrets,
            stamps=records.stamps(),
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
        run["finished_at"] = utc_now()
        run["interrupted"] = self.interrupted
        if self.doc.get("cells") is not None:
            self._write()
        if not self.report and self.doc.get("cells"):
            try:  # the open exports come with the report; without it, on their own
                from speedmatrix.export import write_exports

                write_exports(self.out)
            except Exception as exc:  # noqa: BLE001 - the measurements are safe on disk
                self.progress.message(f"speedmatrix: the exports could not be written: {exc}")
        if self.report:
            try:
                from speedmatrix.report import write_report

                md, html = write_report(self.out, secrets=self._secrets)
                self.progress.message(f"report: {md} and {html}")
            except Exception as exc:  # noqa: BLE001 - the measurements are safe on disk
                self.progress.message(f"speedmatrix: the report could not be written: {exc}")
        if not self.interrupted and not self.unreachable:
            self._say_if_nothing_measured()
        if self.interrupted:  # said even with --quiet: the user needs the way back
            print(
                f"speedmatrix: interrupted; finished cells are in {self.out / 'run.json'}; "
                f"continue with `speedmatrix run --resume {self.out}`",
                file=sys.stderr,
            )

    def _say_if_nothing_measured(self) -> None:
        """A run that measured no cell exits 1 (EXIT_FAILURE); said even with --quiet, with
        why: how many cells failed and the first one's reason."""
        cells = [c for c in self.doc.get("cells") or [] if c.get("status") != "over_capacity"]
        measured = [
            c for c in cells if c.get("status") in ("valid", "queued") and not c.get("not_run")
        ]
        if measured:
            return
        if not cells:
            why = "the plan holds no cell the server can run (every cell is over capacity)"
        else:
            first = cells[0]
            reason = first.get("reason") or first.get("status")
            why = (
                f"{len(cells)} cell(s) failed or were not run; the first, {first.get('id')}: "
                f"{clip(reason, 200)}"
            )
        print(
            f"speedmatrix: error: no cell was measured: {why}; see {self.out / 'run.json'}",
            file=sys.stderr,
            flush=True,
        )

    def _summary(self, cell: dict) -> str:
        return cell_summary(cell)


def run(
    url: str,
    matrix: Matrix,
    out: str | os.PathLike[str] | None = None,
    *,
    api_key: str | None = None,
    model: str | None = None,
    overrides: dict[str, Any] | None = None,
    info: dict[str, Any] | None = None,
    progress: bool = True,
    report: bool = True,
    target: Any = None,
    tokenizer: Any = None,
    probe_running: bool = True,
) -> Run:
    """Measures `matrix` against the server at `url` and returns the saved run
    (`speedmatrix.results.Run`). `out` defaults to a new temporary folder.

    `api_key`, `model` (the served name; default the server's only or first), `overrides`
    (capacity and engine facts, as the CLI's --kv-capacity, --engine, ...), `info` (report
    metadata: launch_command, hardware, revision), `progress` (the live view), `report`
    (write report.md/html), `target` (a discovered Target: no discovery), `tokenizer` (a
    local tokenizer: `callable(text) -> int | list`, an object with `encode`, or a Hugging
    Face name/path loaded with `transformers`/`tokenizers`), `probe_running` (False: never
    send the short load probe that learns a running cap the server does not publish).

    The URL (the CLI's rule: http:// or https://, HOST:PORT as http://) and the matrix are
    checked before anything is sent or written: ValueError naming what is wrong."""
    import tempfile

    from speedmatrix.cliargs import UsageError, base_url

    if not isinstance(matrix, Matrix):
        raise TypeError(f"matrix: a speedmatrix.Matrix, not {type(matrix).__name__}")
    try:
        url = base_url(url, flag="url")
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    matrix.validate()
    if out is None:
        out = tempfile.mkdtemp(prefix="speedmatrix-")
    sweep = Sweep(
        url,
        matrix,
        out,
        api_key=api_key,
        model=model,
        overrides=overrides,
        info=info,
        progress=progress,
        report=report,
        target=target,
        tokenizer=tokenizer,
        probe_running=probe_running,
    )
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
    client=None,
    force: bool = False,
) -> int:
    """Continues the interrupted run saved in `out`: cells already in run.json are kept
    (those left unrun when the server stopped answering are measured now). ``client``: how
    to reach the server (a ClientConfig: key, Basic auth, TLS); the saved URL has none.
    A server whose engine, version, model or limits differ from the saved run's is refused
    unless ``force`` (the difference is then recorded in the run's warnings)."""
    out = Path(out)
    _saved_run(out)  # a folder without a run is said before any lock file is made in it
    # the lock covers reading the saved run too: a resume never continues a stale copy
    with runfile.run_lock(out, "run --resume"):
        return _resume_locked(
            out, _saved_run(out), api_key, progress, report, tokenizer, client, force
        )


def _saved_run(out: Path) -> dict:
    try:
        return runfile.read_run(out)
    except (FileNotFoundError, ValueError) as exc:
        raise SpeedmatrixError(f"cannot resume {out}: {exc}") from exc


def _resume_locked(
    out: Path, doc: dict, api_key, progress: bool, report: bool, tokenizer, client, force: bool
) -> int:
    from speedmatrix.matrix import Matrix

    meta = doc["meta"]
    matrix = Matrix.from_dict(meta["run"]["matrix"])
    given = {
        k: v["value"]
        for k, v in meta.get("capacity", {}).items()
        if isinstance(v, dict) and v.get("source") == "given"
    }
    redo = [
        c.get("id", "?")
        for c in doc.get("cells", [])
        if c.get("not_run") or c.get("status") not in KEPT_ON_RESUME
    ]
    if redo:  # said even with --quiet: those cells' saved figures will be replaced
        print(
            f"speedmatrix: --resume measures again {len(redo)} cell(s) not valid: "
            + ", ".join(redo[:12])
            + (f" and {len(redo) - 12} more" if len(redo) > 12 else ""),
            file=sys.stderr,
        )
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
        client=client,
        force=force,
    )
    return sweep.execute()


def _open_loop_spec(spec, cell) -> None:
    """Turns a CellSpec into a request-rate cell's: arrivals on the cell's schedule, seeded
    by its id (the same cell, the same schedule), the gate and the drain bound."""
    from speedmatrix.matrix import parse_arrival

    kind, shape = parse_arrival(cell.arrival)
    spec.mode = "open"
    spec.rate_per_s = float(cell.rate_per_s)
    spec.arrival = kind
    spec.gamma_shape = float(shape)
    spec.max_concurrency = int(cell.concurrency)
    spec.seed = zlib.crc32(cell.id.encode())
    spec.drain_timeout_s = float(cell.drain_timeout_s)


#: the most cells a search measures per context
SEARCH_MAX_CELLS = 8


class _Stop(Exception):
    """A search ends early: interrupted, or the server stopped answering."""
