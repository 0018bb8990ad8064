"""The server between cells: waiting until it is idle before a cell, and finding it gone
(the cells left are then marked `error`, "server unreachable", for `--resume`)."""

from __future__ import annotations

import sys
import time

from speedmatrix import verdict
from speedmatrix.errors import clip
from speedmatrix.sweep.state import SERVER_UNREACHABLE
from speedmatrix.sweep.store import SweepStore

# After a cell with failed requests the server is asked whether it still answers:
# this many tries, this far apart (a refused connection fails at once).
REPROBE_TRIES = 3
REPROBE_PAUSE_S = 0.5
#: the longest the /metrics read before a cell may take (the idle check)
IDLE_READ_TIMEOUT_S = 2.0
#: a wait for an idle server this long is said on the terminal; a gauge stuck through a
#: whole wait is waited for only this long before the later cells
IDLE_SAY_AFTER_S = 5.0


class SweepServer(SweepStore):
    """The idle wait before a cell and the check that the server still answers."""

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
