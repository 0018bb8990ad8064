"""The views of a request-rate (open-loop) run: its decode grid of contexts × rates, its
size line, and the open-loop table of asked and achieved rates and latency from the
scheduled time. The cells are grouped as `Run.load_matrix` pivots them (:func:`load_grid`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from speedmatrix import figures
from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import (
    by_rate,
    cell_class,
    cell_flags,
    cell_lines,
    error_kind,
    load_text,
    ordered_cells,
    rate_text,
    status_lines,
    status_notes,
    status_of,
)
from speedmatrix.report.model import Section, Table

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


@dataclass
class LoadGrid:
    """Decode cells by (context, load), in `Run.load_matrix`'s layout."""

    rate: bool
    contexts: list[int]
    labels: list[str]
    loads: list[Any]
    groups: dict[tuple[int, Any], list[dict]]

    def row(self, context: int) -> list[tuple[Any, list[dict], str | None]]:
        """(load, its cells, their status) of each column at ``context``, in order."""
        out = []
        for x in self.loads:
            cells = self.groups.get((context, x), [])
            out.append((x, cells, status_of(cells)))
        return out


def load_grid(run: Run) -> LoadGrid:
    """The decode cells grouped as `Run.load_matrix` pivots them: rows = contexts, columns =
    request rates for a rate run, else concurrencies."""
    rate = by_rate(run)
    groups: dict[tuple[int, Any], list[dict]] = {}
    labels: dict[int, str] = {}
    for c in ordered_cells(run):
        if c.get("phase") != "decode":
            continue
        x: Any = c.get("rate_per_s") if rate else c.get("concurrency")
        if fmt.missing(x):
            continue
        key = (int(c["context"]), float(x) if rate else int(x))
        groups.setdefault(key, []).append(c)
        labels.setdefault(int(c["context"]), str(c.get("label") or fmt.context_label(c["context"])))
    contexts = sorted(labels)
    loads = sorted({k[1] for k in groups})
    return LoadGrid(rate, contexts, [labels[c] for c in contexts], loads, groups)


def figure_grid(run: Run, figure: str) -> Any:
    """`Run.load_matrix` of ``figure`` as numbers; all NaN when no cell has the figure (every
    cell over capacity, say), in the same layout."""
    try:
        return run.load_matrix(figure, numeric=True)
    except KeyError:
        return run.load_matrix("context", numeric=True) * np.nan


def rate_matrix_line(run: Run) -> str:
    """The header's size line of a request-rate run: contexts × rates, and the arrivals."""
    grid = load_grid(run)
    m = (run.meta.get("run") or {}).get("matrix") or {}
    rates = [float(r) for r in m.get("request_rates") or []] or list(grid.loads)
    ctx = sorted(set(grid.contexts) | {int(c) for c in m.get("contexts") or [] if str(c).isdigit()})
    rates_text = ", ".join(f"{r:g}" for r in sorted(rates))
    parts = [
        f"{fmt.plural(len(ctx), 'context')} {fmt.range_text(ctx, fmt.context_label)} × "
        + f"{fmt.plural(len(rates), 'request rate')} ({rates_text} req/s)"
    ]
    if m.get("arrival"):
        parts.append(f"{m['arrival']} arrivals")
    if m.get("max_concurrency"):
        parts.append(f"at most {m['max_concurrency']} in flight")
    pre = run.matrix_definition["prefill_contexts"]
    if pre:
        parts.append("prefill at " + ", ".join(fmt.context_label(c) for c in pre))
    return " · ".join(parts)


def rate_decode_section(run: Run) -> Section:
    """The sustained-decode grid of a request-rate run: contexts × rates (`Run.load_matrix`),
    each cell's total tok/s and median TTFT, status-aware and flag-marked as the closed-loop
    grid (whose columns are concurrencies)."""

    grid = load_grid(run)
    if not grid.groups:
        return Section(
            "Sustained decode", text=["No decode cell was measured."], anchor="sustained-decode"
        )
    tot = figure_grid(run, "total_tok_s")
    ttft = figure_grid(run, "ttft_ms")
    rows, classes, statuses, kinds, flagged = [], [], [], [], False
    for ctx, label in zip(grid.contexts, grid.labels):
        row: list[Any] = [label]
        cls = ["ctx"]
        for x, cells, st in grid.row(ctx):
            statuses.append(st)
            c = cell_class(st)
            if st in ("valid", "queued"):
                flags = cell_flags(cells)
                if flags:
                    flagged, c = True, c + " flagged"
                row.append(cell_lines(st, tot.loc[label, x], ttft.loc[label, x], 0, flags))
            else:
                if st == "error":
                    kinds.append(error_kind(cells))
                row.append(status_lines(st, cells))
            cls.append(c)
        rows.append(row)
        classes.append(cls)
    tbl = Table(
        ["Context"] + [f"{x:g}" for x in grid.loads],
        rows,
        caption="total tok/s · rows are context length, columns are request rates (req/s)",
        note=fmt.legend(statuses),
        classes=classes,
    )
    text = [
        (
            "Open-loop cells have no warm-up: every arrival pays its prefill, and TTFT here is "
            "the median from the send (see Open loop for latency from the scheduled time)."
        ),
        *status_notes(run, statuses, kinds, flagged),
    ]
    return Section(
        "Sustained decode", table=tbl if rows else None, text=text, anchor="sustained-decode"
    )


def _lat(c: dict, name: str, stat: str) -> Any:
    col = f"{name}_{stat}_ms"
    return c.get(figures.RENAMED.get(col, col))


def _tail(run: Run) -> str | None:
    """The latency percentile the open-loop table shows beside the median: p99 when
    recorded, else the highest recorded."""
    m = (run.meta.get("run") or {}).get("matrix") or {}
    ps = [float(p) for p in m.get("percentiles") or [] if not fmt.missing(p)]
    ps = [p for p in ps if p > 50]
    if not ps:
        return None
    p = 99.0 if 99.0 in ps else max(ps)
    return f"p{p:g}"


def _open_loop_row(c: dict, tail: str | None, n_cols: int) -> tuple[list[Any], list[str]]:
    """An open-loop cell's row, and the sentence saying the server could not keep up when the
    verdict says so (``open_loop.kept_up`` false, or the ``behind`` flag)."""
    rate = load_text(c["rate_per_s"], True)
    st = c.get("status")
    if st in ("over_capacity",) or fmt.missing(c.get("open_loop_arrivals")):
        return [c["label"], rate, fmt.status_text(st)] + [fmt.DASH] * (n_cols - 3), []

    def pair(name: str, stat: str) -> str:
        a, b = _lat(c, f"{name}_sched", stat), _lat(c, name, stat)
        return f"{fmt.ms(a)} / {fmt.ms(b)}"

    unfinished = int(c.get("open_loop_failed") or 0) + int(c.get("open_loop_cancelled") or 0)
    row = [
        c["label"],
        rate,
        fmt.status_text(st),
        f"{rate_text(c.get('open_loop_achieved_rate_per_s'))} req/s",
        fmt.count(c.get("open_loop_arrivals")),
        fmt.count(c.get("open_loop_completed")),
        fmt.count(unfinished),
        fmt.count(c.get("open_loop_in_flight_max")),
        pair("ttft", "median"),
        pair("e2e", "median"),
    ]
    if tail:
        row.append(pair("e2e", tail))
    kept = c.get("open_loop_kept_up")
    kept = None if fmt.missing(kept) else bool(kept)
    row.append(fmt.DASH if kept is None else ("yes" if kept else "no"))
    if kept is False or "behind" in list(c.get("flags") or []):
        reason = c.get("open_loop_reason")
        return row, [
            f"The server could not keep up at {c['label']} context × {rate}"
            + (f": {reason}." if not fmt.missing(reason) else ".")
        ]
    return row, []


def open_loop_section(run: Run) -> Section | None:
    """Open-loop cells: asked and achieved rate, arrivals and outcomes, and latency from the
    scheduled time beside latency from the send (wrk2's two views); the cells whose server
    could not keep up are said in words. None for a closed-loop run."""
    cells = [
        c
        for c in ordered_cells(run)
        if c.get("phase") == "decode" and not fmt.missing(c.get("rate_per_s"))
    ]
    if not cells:
        return None
    tail = _tail(run)
    cols = [
        "Context",
        "Rate asked",
        "Status",
        "Achieved",
        "Arrivals",
        "Completed",
        "Failed or unfinished",
        "In flight (max)",
        "TTFT median: from schedule / from send",
        "E2E median: from schedule / from send",
    ]
    if tail:
        cols.append(f"E2E {tail}: from schedule / from send")
    cols.append("Kept up")
    rows, behind = [], []
    for c in cells:
        row, said = _open_loop_row(c, tail, len(cols))
        rows.append(row)
        behind += said
    arrival = ((run.meta.get("run") or {}).get("matrix") or {}).get("arrival")
    gate = ((run.meta.get("run") or {}).get("matrix") or {}).get("max_concurrency")
    how = []
    if not fmt.missing(arrival):
        how.append(f"{arrival} arrivals")
    if gate:
        how.append(f"at most {gate} in flight (the rest wait at the client)")
    text = [
        (
            "Latency from the scheduled time is what a user who arrived then waited, including "
            "any wait at the client's gate; latency from the send is the server's own pace. "
            "When the first grows while the second stays flat, the backlog is building on the "
            "client's side: the server is running as fast as it can and the rate is above what "
            "it holds."
        ),
        *behind,
    ]
    return Section(
        "Open loop",
        items=[("Arrivals", "; ".join(how))] if how else None,
        table=Table(
            cols,
            rows,
            caption=(
                "Requests arrive on a schedule whatever the server does; the window counts "
                "the arrivals scheduled in it, which then finish up to the drain bound."
            ),
            classes=[["txt", "", "txt"] + [""] * (len(cols) - 3) for _ in rows],
        ),
        text=text,
        anchor="open-loop",
    )
