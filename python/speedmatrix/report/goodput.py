"""The report's load and SLO views: the goodput / attainment grid, the capacity answer, and
the open-loop latency table (issue 13).

Every number here comes from `Run.load_matrix` (the cells' stored ``slo`` and ``open_loop``
figures, which `speedmatrix.slo.evaluate` derived from the records) or `Run.capacity` (which
judges every cell from its records): this module only arranges and words them. A report asked
for another SLO than the run's (``speedmatrix report DIR --slo ...``) first re-judges each
cell from its records with the same `speedmatrix.slo.evaluate` (:func:`judged`).

Over 500 lines: the views of a run's load axis (the goodput grid, the capacity answer, the
open-loop table, and a request-rate run's decode grid and summary) share its grouping of cells
by (context, load) and its wording of loads; split they would only import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from speedmatrix import figures
from speedmatrix.recompute import slo_judged_doc
from speedmatrix.report import formatting as fmt

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.report.tables import Section
    from speedmatrix.results import Run

#: marks a grid cell whose attainment is below the target share
BELOW_MARK = "▼"
#: why a measured cell can have no attainment (docs/metrics.md, "SLOs"): said under the grid
#: and the capacity answer whenever such a cell is there
UNJUDGED_NOTE = (
    "No requests judged ({n}): no request of the cell completed inside its window, and none "
    "cut at its end could be decided (with an E2E target, a cut request is decided only once "
    "its elapsed time exceeds the target); the cell is left out of the capacity answer. A "
    "longer --duration, a shorter --max-output or a request-rate run (--request-rate) judges "
    "more."
)


@dataclass
class SloSettings:
    """The SLO a report judges against: targets in ms, the target share, and where they came
    from (``"run"``: recorded with ``--slo``; ``"report"``: given to ``speedmatrix report``)."""

    targets: dict[str, float]
    attainment: float
    source: str = "run"
    caps: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def text(self) -> str:
        from speedmatrix.slo import format_slo

        return format_slo(self.targets)


def recorded_slo(run: Run) -> tuple[dict[str, float], float]:
    """The run's own SLO targets (ms) and attainment share, from ``meta.run.matrix``
    (``{}`` when the run was measured without ``--slo``)."""
    m = (run.meta.get("run") or {}).get("matrix") or {}
    raw = m.get("slo")
    targets = {str(k): float(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    try:
        share = float(m["attainment"]) if m.get("attainment") is not None else 0.95
    except (TypeError, ValueError):
        share = 0.95
    return targets, share


def settings(
    run: Run, slo: str | dict | None = None, attainment: str | float | None = None
) -> SloSettings | None:
    """The SLO the report shows: ``slo``/``attainment`` when given, else the run's own;
    None when neither exists. Raises ValueError (one line) for a malformed ``slo``."""
    from speedmatrix import slo as slo_mod

    rec_targets, rec_share = recorded_slo(run)
    if slo is None and attainment is None:
        if not rec_targets:
            return None
        return SloSettings(rec_targets, rec_share, "run")
    targets = rec_targets
    if slo is not None:
        targets = slo_mod.parse_slo(slo) if isinstance(slo, str) else dict(slo)
    if not targets:
        from speedmatrix.errors import SpeedmatrixError

        raise SpeedmatrixError("--attainment needs --slo: this run recorded no SLO")
    share = rec_share
    if attainment is not None:
        share = (
            slo_mod.parse_attainment(attainment)
            if isinstance(attainment, str)
            else float(attainment)
        )
    source = "run" if (targets == rec_targets and share == rec_share) else "report"
    return SloSettings(targets, share, source)


def judged(run: Run, targets: dict[str, float]) -> Run:
    """``run`` with every decode cell's ``slo`` figures for ``targets``: the run itself when
    its cells were judged against them, else a copy whose cells are re-judged from their
    records by `speedmatrix.recompute.slo_judged_doc` (the one way a report re-judges)."""
    from speedmatrix.results import Run as RunClass

    doc = slo_judged_doc(run.doc, lambda c: run.records(c["id"]), targets)
    if doc is run.doc:
        return run
    out = RunClass(doc, run.path, label=run._label)
    out._records_cache = run._records_cache  # the same records: no second read
    return out


def by_rate(run: Run) -> bool:
    """True for a request-rate (open-loop) run: its decode cells are contexts × rates."""
    return any(
        c.get("phase") == "decode" and c.get("rate_per_s") is not None
        for c in run.doc.get("cells") or []
    )


def load_text(x: Any, rate: bool) -> str:
    """``8 req/s`` or ``16 at once``."""
    if fmt.missing(x):
        return fmt.DASH
    v = float(x)
    if rate:
        return f"{v:,.3g} req/s" if v < 1000 else f"{v:,.0f} req/s"
    return f"{v:,.3g} at once" if not v.is_integer() else f"{int(v):,d} at once"


def _rate(v: Any) -> str:
    """A goodput in req/s: two decimals below 10, one above."""
    if fmt.missing(v):
        return fmt.DASH
    v = float(v)
    return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}"


def _share(v: Any) -> str:
    return fmt.DASH if fmt.missing(v) else f"{float(v) * 100:.1f}%"


@dataclass
class LoadGrid:
    """Decode cells by (context, load), in `Run.load_matrix`'s layout."""

    rate: bool
    contexts: list[int]
    labels: list[str]
    loads: list[Any]
    groups: dict[tuple[int, Any], list[dict]]


def load_grid(run: Run) -> LoadGrid:
    """The decode cells grouped as `Run.load_matrix` pivots them: rows = contexts, columns =
    request rates for a rate run, else concurrencies."""
    from speedmatrix.report.tables import ordered_cells

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


def _numbers(run: Run, figure: str) -> Any:
    """`Run.load_matrix` of ``figure`` as numbers; all NaN when no cell has the figure (every
    cell over capacity, say), in the same layout."""
    try:
        return run.load_matrix(figure, numeric=True)
    except KeyError:
        return run.load_matrix("context", numeric=True) * np.nan


def _status(cells: list[dict]) -> str | None:
    from speedmatrix.results import combined_status

    return combined_status([str(c.get("status") or "") for c in cells]) if cells else None


def _cell_class(status: str | None) -> str:
    return {"over_capacity": "over", "queued": "queued", "error": "error", None: "missing"}.get(
        status, "valid"
    )


def _status_lines(status: str | None, cells: list[dict]) -> list[str]:
    from speedmatrix.report.tables import cell_lines, error_kind

    kind = error_kind(cells) if status == "error" else "failed"
    errs = sum(
        int(c.get("errors_total") or 0) for c in cells if not fmt.missing(c.get("errors_total"))
    )
    return cell_lines(status, None, None, errs, None, kind)


def goodput_section(run: Run, s: SloSettings) -> Section:
    """The goodput / attainment grid: contexts × load, each cell its goodput (req/s and
    output tok/s of the requests meeting the SLO) and attainment, a cell below the target
    share marked with the target it missed most; status-aware and flag-marked as the
    sustained-decode grid."""
    from speedmatrix.report import tables
    from speedmatrix.report.tables import FLAG_SHORT, Section, Table, cell_flags

    grid = load_grid(run)
    if not grid.groups:
        return Section("Goodput at SLO", text=["No decode cell was measured."], anchor="goodput")
    req = _numbers(run, "slo_goodput_req_s")
    tok = _numbers(run, "slo_goodput_tok_s")
    att = _numbers(run, "slo_attainment")
    # a --search run measures only the loads it needs: its grid is sparse by design
    search = bool(((run.meta.get("run") or {}).get("matrix") or {}).get("search"))
    rows, classes, statuses, kinds = [], [], [], []
    below_any = flagged_any = skipped = False
    unjudged = 0
    for i, ctx in enumerate(grid.contexts):
        label = grid.labels[i]
        row: list[Any] = [label]
        cls = ["ctx"]
        for x in grid.loads:
            cells = grid.groups.get((ctx, x), [])
            st = _status(cells)
            c = _cell_class(st)
            if st is None and search:
                skipped = True
                row.append([fmt.DASH])
                cls.append(c)
                continue
            statuses.append(st)
            if st not in ("valid", "queued"):
                if st == "error":
                    kinds.append(tables.error_kind(cells))
                row.append(_status_lines(st, cells))
                cls.append(c)
                continue
            a = att.loc[label, x]
            lines = _goodput_lines(req.loc[label, x], tok.loc[label, x], grid.rate)
            if st == "queued":
                lines.append("Requests queued")
            if fmt.missing(a):
                unjudged += 1
                lines.append("no requests judged")
            else:
                lines.append(f"{_share(a)} met")
                if float(a) < s.attainment:
                    below_any = True
                    c += " below"
                    worst = _failed_most(cells)
                    lines.append(
                        f"{BELOW_MARK} below {_share(s.attainment)}"
                        + (f": {worst}" if worst else "")
                    )
            flags = cell_flags(cells)
            if flags:
                flagged_any = True
                c += " flagged"
                lines.append(f"{fmt.FLAG_MARK} " + ", ".join(FLAG_SHORT.get(f, f) for f in flags))
            row.append(lines)
            cls.append(c)
        rows.append(row)
        classes.append(cls)
    cols = ["Context"] + [f"{x:g}" if grid.rate else str(x) for x in grid.loads]
    what = "request rates (req/s)" if grid.rate else "simultaneous requests"
    first = "goodput req/s · goodput output tok/s" if grid.rate else "goodput output tok/s · req/s"
    caption = (
        f"{first} · share of requests meeting SLO {s.text} · "
        f"rows are context length, columns are {what}"
    )
    text = [
        "Goodput counts only the requests that met every target of the SLO: completed "
        "requests meeting it per second of the window, and their output tokens per second. "
        "Attainment is the share of the window's requests that met it"
        + (
            " (judged from the scheduled time in an open-loop cell, what a user who arrived "
            "then waited)."
            if grid.rate
            else "."
        )
    ]
    if below_any:
        text.append(
            f"{BELOW_MARK} Below target: fewer than {_share(s.attainment)} of the cell's "
            "requests met the SLO; the target missed most is named (error: failed requests)."
        )
    text += tables.status_notes(run, statuses, kinds, flagged_any)
    if skipped:
        text.append(f"{fmt.DASH}: a load the search (--search) did not need to measure.")
    if unjudged:
        text.append(UNJUDGED_NOTE.format(n=fmt.plural(unjudged, "measured cell")))
    items = [
        ("SLO", s.text + ("" if s.source == "run" else " (asked of this report; not the run's)")),
        ("Target attainment", _share(s.attainment)),
    ]
    tbl = Table(cols, rows, caption=caption, note=fmt.legend(statuses), classes=classes)
    return Section(
        "Goodput at SLO",
        items=items,
        table=tbl if rows else None,
        text=text if rows else ["No decode cell was measured."],
        anchor="goodput",
        css="matrix",
    )


def _goodput_lines(req_s: Any, tok_s: Any, rate: bool) -> list[str]:
    """A grid cell's two goodput lines, the headline first: req/s for a request-rate run
    (requests complete in its window), output tok/s for a closed-loop one (whose long
    requests mostly run past the window: few complete in it, their tokens count)."""
    r, t = _rate(req_s), fmt.tok_s(tok_s)
    return [r, f"{t} tok/s"] if rate else [t, f"{r} req/s"]


def _failed_most(cells: list[dict]) -> str | None:
    """The target most missed over a cell's reported repetitions (from their ``slo.missed``)."""
    total: dict[str, int] = {}
    for c in cells:
        if c.get("status") not in ("valid", "queued"):
            continue
        missed = c.get("slo_missed")
        if not isinstance(missed, dict):
            continue
        for k, v in missed.items():
            total[k] = total.get(k, 0) + int(v or 0)
    if not total or max(total.values()) == 0:
        return None
    return max(total.items(), key=lambda kv: kv[1])[0]


def capacities(run: Run, s: SloSettings) -> dict[int, dict[str, Any]]:
    """`Run.capacity` for the report's SLO (computed once per report)."""
    if not s.caps:
        s.caps = run.capacity(s.targets, s.attainment)
    return s.caps


def capacity_section(run: Run, s: SloSettings) -> Section:
    """The capacity answer per context: largest passing load, first failing, the interpolated
    estimate and its method (`Run.capacity`), and the chart of attainment against load."""
    from speedmatrix.report.tables import Section, Table

    caps = capacities(run, s)
    search = (run.meta.get("run") or {}).get("search") or {}
    rows = []
    for ctx, cap in caps.items():
        rate = cap.get("by") == "rate"
        est_text = _estimate_text(cap)
        points = ", ".join(f"{x:g}: {_share(a)}" for x, a in cap.get("points") or [])
        found = search.get(str(ctx))
        if isinstance(found, dict) and found.get("cells"):
            points += (
                f" (--search: {found['cells']} cells, "
                + ("converged" if found.get("converged") else "not converged")
                + ")"
            )
        rows.append(
            [
                str(cap.get("label") or fmt.context_label(ctx)),
                load_text(cap.get("passing"), rate),
                load_text(cap.get("failing"), rate),
                est_text,
                str(cap.get("method") or fmt.DASH),
                points or fmt.DASH,
            ]
        )
    tbl = Table(
        [
            "Context",
            "Largest passing load",
            "First failing load",
            "Estimate",
            "Method",
            "Measured (load: attainment)",
        ],
        rows,
        caption=(
            f"How much load each context holds at SLO {s.text} with at least "
            f"{_share(s.attainment)} of requests meeting it, judged from every cell's records "
            "(a cell over capacity counts as 0%)."
        ),
        classes=[["txt", "", "", "", "wrap", "wrap"] for _ in rows],
    )
    text = [] if rows else ["No decode cell with records was measured."]
    unjudged = sum(
        1
        for c in run.doc.get("cells") or []
        if c.get("phase") == "decode"
        and c.get("status") in ("valid", "queued")
        and fmt.missing((c.get("slo") or {}).get("attainment"))
    )
    if unjudged:
        text.append(UNJUDGED_NOTE.format(n=fmt.plural(unjudged, "measured cell")))
    return Section(
        "Capacity at SLO",
        table=tbl if rows else None,
        text=text,
        anchor="capacity-at-slo",
        charts=["capacity_vs_load"] if rows else [],
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


def open_loop_section(run: Run) -> Section | None:
    """Open-loop cells: asked and achieved rate, arrivals and outcomes, and latency from the
    scheduled time beside latency from the send (wrk2's two views); the cells whose server
    could not keep up are said in words. None for a closed-loop run."""
    from speedmatrix.report.tables import Section, Table, ordered_cells

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
        rate = load_text(c["rate_per_s"], True)
        st = c.get("status")
        if st in ("over_capacity",) or fmt.missing(c.get("open_loop_arrivals")):
            rows.append([c["label"], rate, fmt.status_text(st)] + [fmt.DASH] * (len(cols) - 3))
            continue

        def pair(name: str, stat: str, c: dict = c) -> str:
            a, b = _lat(c, f"{name}_sched", stat), _lat(c, name, stat)
            return f"{fmt.ms(a)} / {fmt.ms(b)}"

        kept = c.get("open_loop_kept_up")
        row = [
            c["label"],
            rate,
            fmt.status_text(st),
            f"{_rate(c.get('open_loop_achieved_rate_per_s'))} req/s",
            fmt.count(c.get("open_loop_arrivals")),
            fmt.count(c.get("open_loop_completed")),
            fmt.count(int(c.get("open_loop_failed") or 0) + int(c.get("open_loop_cancelled") or 0)),
            fmt.count(c.get("open_loop_in_flight_max")),
            pair("ttft", "median"),
            pair("e2e", "median"),
        ]
        if tail:
            row.append(pair("e2e", tail))
        kept = None if fmt.missing(kept) else bool(kept)
        row.append(fmt.DASH if kept is None else ("yes" if kept else "no"))
        if kept is False or "behind" in list(c.get("flags") or []):
            reason = c.get("open_loop_reason")
            behind.append(
                f"The server could not keep up at {c['label']} context × {rate}"
                + (f": {reason}." if not fmt.missing(reason) else ".")
            )
        rows.append(row)
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


def _estimate_text(cap: dict[str, Any]) -> str:
    rate = cap.get("by") == "rate"
    if cap.get("estimate") is not None:
        return f"≈ {load_text(cap['estimate'], rate)}"
    if cap.get("passing") is not None:
        return f"at least {load_text(cap['passing'], rate)}"
    if cap.get("failing") is not None:
        return f"below {load_text(cap['failing'], rate)}"
    return fmt.DASH


def summary_items(run: Run, s: SloSettings) -> list[tuple[str, str]]:
    """The summary's line for the capacity answer: per context, the load it holds at the SLO."""
    caps = capacities(run, s)
    if not caps:
        return []
    per = "; ".join(
        f"{cap.get('label') or fmt.context_label(ctx)}: {_estimate_text(cap)}"
        for ctx, cap in caps.items()
    )
    return [
        (
            "Capacity at SLO",
            f"{per} (SLO {s.text} met by {_share(s.attainment)} of requests; see Capacity at SLO)",
        )
    ]


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
    from speedmatrix.report import tables
    from speedmatrix.report.tables import Section, Table, cell_flags

    grid = load_grid(run)
    if not grid.groups:
        return Section(
            "Sustained decode", text=["No decode cell was measured."], anchor="sustained-decode"
        )
    tot = _numbers(run, "total_tok_s")
    ttft = _numbers(run, "ttft_ms")
    rows, classes, statuses, kinds, flagged = [], [], [], [], False
    for i, ctx in enumerate(grid.contexts):
        label = grid.labels[i]
        row: list[Any] = [label]
        cls = ["ctx"]
        for x in grid.loads:
            cells = grid.groups.get((ctx, x), [])
            st = _status(cells)
            statuses.append(st)
            c = _cell_class(st)
            if st in ("valid", "queued"):
                flags = cell_flags(cells)
                if flags:
                    flagged, c = True, c + " flagged"
                row.append(tables.cell_lines(st, tot.loc[label, x], ttft.loc[label, x], 0, flags))
            else:
                if st == "error":
                    kinds.append(tables.error_kind(cells))
                row.append(_status_lines(st, cells))
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
        *tables.status_notes(run, statuses, kinds, flagged),
    ]
    return Section(
        "Sustained decode", table=tbl if rows else None, text=text, anchor="sustained-decode"
    )


def rate_summary_section(run: Run) -> Section:
    """The summary of a request-rate run: peak total tok/s and where, per context the highest
    rate the server kept up with and the first it did not, and the flagged cells."""
    from speedmatrix.report import tables
    from speedmatrix.report.tables import Section, Table

    grid = load_grid(run)
    items: list[tuple[str, str]] = []
    if not grid.groups:
        items.append(("Peak throughput", "No decode cell was measured."))
        return Section("Summary", items=items, anchor="summary")
    tot = _numbers(run, "total_tok_s")
    vals = tot.to_numpy(float)
    if not vals.size or not np.isfinite(vals).any():
        items.append(("Peak throughput", "No decode cell was measured."))
    else:
        pi, pj = np.unravel_index(np.nanargmax(vals), vals.shape)
        items.append(
            (
                "Peak throughput",
                (
                    f"{fmt.tok_s(vals[pi, pj])} total tok/s at {tot.index[pi]} context × "
                    f"{load_text(tot.columns[pj], True)}"
                ),
            )
        )
    rows = []
    n_flagged = n_cells = 0
    why: dict[str, int] = {}
    for i, ctx in enumerate(grid.contexts):
        kept: list[Any] = []
        behind: list[Any] = []
        over: list[Any] = []
        for x in grid.loads:
            cells = grid.groups.get((ctx, x), [])
            st = _status(cells)
            if st == "over_capacity":
                over.append(x)
            if st not in ("valid", "queued"):
                continue
            n_cells += 1
            flags = tables.cell_flags(cells)
            if flags:
                n_flagged += 1
                for f in flags:
                    why[f] = why.get(f, 0) + 1
            (behind if "behind" in flags else kept).append(x)
        peak = tot.iloc[i].to_numpy(float)
        best = int(np.nanargmax(peak)) if np.isfinite(peak).any() else None
        rows.append(
            [
                grid.labels[i],
                fmt.DASH
                if best is None
                else f"{fmt.tok_s(peak[best])} at {load_text(grid.loads[best], True)}",
                load_text(max(kept), True) if kept else fmt.DASH,
                load_text(min(behind), True)
                if behind
                else ("kept up at every rate measured" if kept else fmt.DASH),
                load_text(min(over), True) if over else fmt.DASH,
            ]
        )
    if n_flagged:
        text = ", ".join(
            f"{tables.FLAG_SHORT.get(f, f)} ({n})"
            for f, n in sorted(why.items(), key=lambda kv: -kv[1])
        )
        items.append(
            (
                "Flagged cells",
                (
                    f"{n_flagged} of {n_cells} measured cells ({fmt.FLAG_MARK} in the grid): "
                    f"{text}; see Flags"
                ),
            )
        )
    else:
        items.append(("Flagged cells", f"None of {n_cells} measured cells"))
    tbl = Table(
        [
            "Context",
            "Peak total tok/s",
            "Highest rate kept up",
            "Could not keep up from",
            "Over capacity from",
        ],
        rows,
        caption=(
            "Per context: the highest request rate whose backlog did not grow through the "
            "window, the first that did (the server could not keep up), and the first rate "
            "not run because its requests in flight would not fit the KV cache."
        ),
        classes=[["txt", "", "txt", "txt", "txt"] for _ in rows],
    )
    return Section("Summary", items=items, table=tbl if rows else None, anchor="summary")
