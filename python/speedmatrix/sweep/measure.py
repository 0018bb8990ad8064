"""Measuring one cell: its CellSpec for the core (`_core.CellRunner`), run on a worker
thread so Ctrl-C stays responsive, and its records judged by `speedmatrix.verdict`."""

from __future__ import annotations

import threading
import time
import zlib

import numpy as np

from speedmatrix import trafficrun, verdict
from speedmatrix._native import _core
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.matrix import parse_arrival
from speedmatrix.records import Records
from speedmatrix.shards import driver as shards_driver
from speedmatrix.sweep.prompting import SweepPrompts
from speedmatrix.sweep.state import CellOutcome


class SweepMeasure(SweepPrompts):
    """One prefill or decode cell, from its prompts to its stored figures."""

    def _spec(
        self,
        cell,
        concurrency: int,
        bodies: list[bytes],
        warmup: list[bytes],
        duration_s: float,
        max_requests: int = 0,
    ):

        spec = _core.CellSpec()
        spec.url = self.target.endpoint(cell.api)
        spec.api = _core.ApiKind.chat if cell.api == "chat" else _core.ApiKind.completions
        spec.bodies = bodies
        spec.warmup_bodies = warmup
        spec.concurrency = concurrency
        spec.duration_s = float(duration_s)
        spec.max_requests = int(max_requests)
        spec.idle_timeout_s = float(cell.request_idle_timeout_s)
        # the client's event loops (--client-threads; 0: auto, docs/SCALE.md)
        spec.client_threads = int(cell.client_threads)
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

    def _measure_records(self, spec) -> Records | None:
        """Runs a cell's spec and returns its records; None when interrupted (the sweep
        is then marked interrupted)."""
        if self.shards is not None:  # --ray: the cell's load dealt over the shard actors
            return shards_driver.sweep_cell(self, spec)
        res, interrupted = self._run_spec(spec)
        if interrupted:
            self.interrupted = True
            return None
        return Records.from_result(res)

    def _cooldown(self) -> None:
        time.sleep(float(self.matrix.prefill_cooldown_s))

    def _measured_prompt_rate(self) -> float | None:
        """Prompt tok/s: the median of the prefill cells measured so far (None before any)."""
        measured = [
            float(c["prompt_tok_s"])
            for c in self.cells.values()
            if c.get("phase") == "prefill" and c.get("prompt_tok_s")
        ]
        return float(np.median(measured)) if measured else None

    def _prompt_rate(self) -> float:
        """Prompt tok/s: the median measured prefill so far, else a cautious guess."""
        rate = self._measured_prompt_rate()
        return 10_000.0 if rate is None else rate

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
        records = self._measure_records(spec)
        if records is None:  # interrupted
            return None
        return self._store_measured(
            verdict.prefill_cell(cell, records, idle=idle), records, prompts
        )

    def _measure_decode(self, cell) -> CellOutcome | None:
        if trafficrun.is_traffic_cell(cell):  # issue 23's shapes: their own runs
            return trafficrun.measure(self, cell)
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
            open_loop_spec(spec, cell)
        else:
            self._decode_bounds(spec, cell)
        records = self._measure_records(spec)
        if records is None:  # interrupted
            return None
        out = self._store_measured(self._judge_decode(cell, records, idle), records, prompts)
        if measures_prefill:
            pcell = self._planned[prefill_id]
            pdict = verdict.prefill_cell(pcell, records, idle=idle, measured_in=cell.id)
            self._store_measured(pdict, records, prompts)
        return out

    def _judge_decode(self, cell, records: Records, idle: bool) -> dict:
        """A decode-phase cell's stored form, as `recompute` judges it again: every cell
        that measures decode (the grid's, a cached fraction's, a trace's) comes here."""
        return verdict.decode_cell(
            cell,
            records,
            self.facts,
            self.rules,
            idle=idle,
            percentiles=cell.percentiles,
            slo_targets=cell.slo,
            # this host's `speedmatrix selftest`, as the run recorded it when it started
            client_roofline=(self.doc.get("meta") or {}).get("client_roofline"),
        )


def open_loop_spec(spec, cell) -> None:
    """Turns a CellSpec into a request-rate cell's: arrivals on the cell's schedule, seeded
    by its id (the same cell, the same schedule), the gate and the drain bound."""

    kind, shape = parse_arrival(cell.arrival)
    spec.mode = "open"
    spec.rate_per_s = float(cell.rate_per_s)
    spec.arrival = kind
    spec.gamma_shape = float(shape)
    spec.max_concurrency = int(cell.concurrency)
    spec.seed = zlib.crc32(cell.id.encode())
    spec.drain_timeout_s = float(cell.drain_timeout_s)
