"""`Sweep`: a matrix run against one server, in order: discovery, the plan, run.json
before the first cell, then each cell (the layers below: `measure`, `server`, `store`,
`search`). See `speedmatrix.sweep` for what a sweep does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from speedmatrix import runfile
from speedmatrix.adapters import discover, strip_credentials
from speedmatrix.dryrun import estimate_cells_s
from speedmatrix.errors import SpeedmatrixError, clip
from speedmatrix.http import ClientConfig, url_credentials
from speedmatrix.plan import plan_learning_running
from speedmatrix.progress import Progress
from speedmatrix.prompts import load_tokenizer
from speedmatrix.results import load
from speedmatrix.runmeta import (
    plan_meta,
    run_meta,
    server_changes,
    tokenizer_name,
    utc_now,
    verdict_meta,
)
from speedmatrix.shards.driver import refuse_unsharded
from speedmatrix.sweep.prompting import sent_its_prompts
from speedmatrix.sweep.search import SweepSearch
from speedmatrix.sweep.sparse import SparseRun, closed_loop_decode
from speedmatrix.verdict import EngineFacts, Rules

if TYPE_CHECKING:
    from speedmatrix.results import Run


class Sweep(SweepSearch):
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
        shards=None,
    ):

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
        #: --ray: a `speedmatrix.shards.pool.ShardPool` the cells' load is dealt over
        self.shards = shards

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
        stale = runfile.clean_stale_temp(self.out)  # left by a writer killed with -9
        if stale:
            self.progress.message(
                f"speedmatrix: removed {len(stale)} temporary file(s) an interrupted write left "
                f"in {self.out} ({clip(', '.join(stale), 200)})"
            )
        given_tokenizer = None
        if isinstance(self.tokenizer, (str, os.PathLike)):
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
        if self.shards is not None:  # refused before run.json is written
            refuse_unsharded([c for c in planned if c.runnable], self.shards.size)
        self._begin(planned, given_tokenizer)
        if self.shards is not None:
            self.doc["meta"]["run"]["shards"] = self.shards.describe()

        todo = [c for c in planned if c.runnable and not self._done(c.id)]
        sparse = self._sparse_plan(planned)
        if sparse is not None:  # the grid's cells outside the design wait to be chosen
            todo = [c for c in todo if c.id not in sparse.held()]
        prefill_from_warmup = self._prefill_from_warmup(planned, todo)
        runnable = [c for c in todo if not (c.phase == "prefill" and c.id in prefill_from_warmup)]
        self.progress.plan(planned, self.cells)
        try:
            total = self._measure_cells(planned, runnable, sparse)
            if self.matrix.search and not self.interrupted and not self.unreachable:
                self._search(planned, done=total)
            if sparse is not None and not self.interrupted and not self.unreachable:
                self._store_predicted(sparse, {c.id for c in runnable})
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            self.progress.close()
            self._finish()
        if self.interrupted:
            return 130
        return 1 if self.unreachable else 0

    def _measure_cells(self, planned, runnable: list, sparse: SparseRun | None) -> int:
        """Measures ``runnable`` in order; a sparse plan appends each cell it chooses after
        them until it stops. Returns how many cells the run meant to measure."""
        total = sparse.most + len(runnable) - len(sparse.first) if sparse else len(runnable)
        i = 0
        while i < len(runnable) or sparse is not None:
            if i == len(runnable):
                assert sparse is not None
                chosen = sparse.next({c.id for c in runnable})
                if chosen is None:
                    break
                runnable.append(chosen)
                total = max(total, len(runnable))
            i += 1
            cell = runnable[i - 1]
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
            if sparse is not None:
                sparse.mark(cell, outcome.cell.get("status") in ("valid", "queued"))
            self.progress.end_cell(self._summary(outcome.cell), outcome.cell)
            if self._server_lost(outcome.cell):
                self._mark_unreachable(planned, after=self._label(cell))
                break
        return total

    def _check_same_server(self) -> None:
        """A resumed run continues only on the server it measured: its engine, version,
        model and limits as saved. Otherwise one line naming what changed, before anything
        is written; with --force the difference goes into the run's warnings."""

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

    def _sparse_plan(self, planned) -> SparseRun | None:
        """The sparse plan's order of decode cells (None: a full plan measures them all)."""
        if getattr(self.matrix, "plan", "full") != "sparse":
            return None
        grid = [c for c in planned if closed_loop_decode(c)]
        done = {c.id for c in grid if self._done(c.id)}
        family = (planned.capacity_model or {}).get("family")
        return SparseRun(
            grid, done, self.matrix, self.out, planned.max_running, self.progress.message, family
        )

    def _store_predicted(self, sparse: SparseRun, tried: set[str]) -> None:
        """The grid's cells not measured, stored as predicted, and the plan in meta.run."""
        for cell in sparse.predicted_cells(tried):
            if not self._done(cell["id"]):
                self.cells[cell["id"]] = cell
        self.doc["meta"]["run"].update(sparse.meta())
        self._write()

    def run_result(self) -> Run:
        return load(self.out)

    def _prefill_from_warmup(self, planned, todo) -> dict[str, str]:
        """Prefill cell id -> id of the decode cell whose N=1 warm-up measures it.

        Only a decode cell still to run (in ``todo``) can measure a prefill: when a resumed
        run already has the N=1 cell but not its prefill (stopped between the two), or a
        sparse plan does not measure it, the prefill cell is measured on its own."""
        todo_ids = {c.id for c in todo}
        decode_n1 = {
            (c.context, c.repetition): c
            for c in planned
            if c.phase == "decode"
            and c.concurrency == 1
            and c.rate_per_s is None
            and c.cached_fraction is None  # its warm-up is its prefix alone
            and c.runnable
            and c.id in todo_ids
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

    def _eta(self, remaining) -> list[float]:
        """Seconds each of the ``remaining`` cells will take (dryrun.estimate_s): warm-ups
        and prefill at the median prefill rate measured so far, prompts already sent
        counted as sent."""
        sent: dict[tuple[int, int], int] = {}
        for c in self.cells.values():
            if sent_its_prompts(c):
                key = (c["context"], c.get("repetition", 0))
                sent[key] = max(sent.get(key, 0), int(c["concurrency"]))
        return estimate_cells_s(
            remaining, self.matrix, prefill_tok_s=self._measured_prompt_rate(), sent=sent
        )
