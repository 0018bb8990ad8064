"""A sweep's run.json: storing a cell, writing the run after every cell, the run's
warnings, its end (the report or exports, what an interrupted or empty run says)."""

from __future__ import annotations

import sys

from speedmatrix import report, runfile, verdict
from speedmatrix.errors import clip
from speedmatrix.export import write_exports
from speedmatrix.http import ConnectError
from speedmatrix.records import Records
from speedmatrix.redact import redact_known
from speedmatrix.report.terminal import cell_summary
from speedmatrix.runmeta import utc_now
from speedmatrix.sweep.state import KEPT_ON_RESUME, CellOutcome, SweepState


class SweepStore(SweepState):
    """What a sweep keeps: run.json and each cell's records."""

    def _done(self, cell_id: str) -> bool:
        """The cell is in run.json with a measurement to keep (valid, queued, over
        capacity); any other (an error, a cell interrupted or left when the server was
        lost) is measured again by --resume."""
        c = self.cells.get(cell_id)
        if c is None or c.get("predicted"):  # a predicted cell was never measured
            return False
        return not c.get("not_run") and c.get("status") in KEPT_ON_RESUME

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

    def _unrun_cell(self, cell) -> CellOutcome:
        return CellOutcome(verdict.unrun_cell(cell, cell.status, cell.reason))

    def _prompt_failure(self, cell, exc: Exception) -> CellOutcome:
        """An `error` cell for a cell whose prompts could not be made (nothing was sent):
        kind `connect` when the server did not answer, else `prompt`."""

        kind = "connect" if isinstance(exc, ConnectError) else "prompt"
        return CellOutcome(verdict.prompt_failure_cell(cell, kind, str(exc)))

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
                write_exports(self.out)
            except Exception as exc:  # noqa: BLE001 - the measurements are safe on disk
                self.progress.message(f"speedmatrix: the exports could not be written: {exc}")
        if self.report:
            try:
                # the report package loads its renderer (matplotlib) on first use
                md, html = report.write_report(self.out, secrets=self._secrets)
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
