"""The SLO search (`--search`): per context, the largest load that meets the SLO, measuring
only the cells the bracket-and-bisect of `speedmatrix.slo.search` needs."""

from __future__ import annotations

from speedmatrix.sweep.measure import SweepMeasure

#: the most cells a search measures per context
SEARCH_MAX_CELLS = 8


class SearchStopped(Exception):
    """A search ends early: interrupted, or the server stopped answering."""


class SweepSearch(SweepMeasure):
    """The search's cells, each stored like a grid cell."""

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
                    raise SearchStopped
                count[0] += 1
                self.progress.start_cell(
                    count[0], done + SEARCH_MAX_CELLS * len(planned.contexts),
                    self._label(cell), self._cell_time(cell), 0.0,
                )  # fmt: skip
                outcome = self._measure_decode(cell)
                if outcome is None:
                    raise SearchStopped
                self.progress.end_cell(self._summary(outcome.cell))
                if self._server_lost(outcome.cell):
                    raise SearchStopped
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
            except SearchStopped:
                break
            found["by"] = m.search
            answers[str(context)] = found
            self._write()
