"""The report's SLO views: the goodput / attainment grid and the capacity at an SLO (how
much load each context holds with the target share of requests meeting the SLO; not the
KV capacity of the metadata sections).

Every number here comes from `Run.load_matrix` (the cells' stored ``slo`` figures, which
`speedmatrix.slo.evaluate` derived from the records) or `Run.capacity`: this module only
arranges and words them. A report asked for another SLO than the run's (``speedmatrix
report DIR --slo ...``) first has each cell's SLO figures derived again from its records
with the same `speedmatrix.slo.evaluate` (:func:`judged`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedmatrix import slo as slo_mod
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.recompute import slo_judged_doc
from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import (
    FLAG_SHORT,
    cell_class,
    cell_flags,
    error_kind,
    load_text,
    rate_text,
    share_text,
    status_lines,
    status_notes,
)
from speedmatrix.report.model import Section, Table
from speedmatrix.report.rates import figure_grid, load_grid
from speedmatrix.results import Run

#: the load each context holds with the SLO met; not the KV capacity (`metadata.KV_CAPACITY_TITLE`)
SLO_CAPACITY_TITLE = "Capacity at SLO"
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
        return slo_mod.format_slo(self.targets)


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
    rec_targets, rec_share = recorded_slo(run)
    if slo is None and attainment is None:
        if not rec_targets:
            return None
        return SloSettings(rec_targets, rec_share, "run")
    targets = rec_targets
    if slo is not None:
        targets = slo_mod.parse_slo(slo) if isinstance(slo, str) else dict(slo)
    if not targets:
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
    doc = slo_judged_doc(run.doc, lambda c: run.records(c["id"]), targets)
    if doc is run.doc:
        return run
    out = Run(doc, run.path, label=run._label)
    out._records_cache = run._records_cache  # the same records: no second read
    return out


def goodput_section(run: Run, s: SloSettings) -> Section:
    """The goodput / attainment grid: contexts × load, each cell its goodput (req/s and
    output tok/s of the requests meeting the SLO) and attainment, a cell below the target
    share marked with the target it missed most; status-aware and flag-marked as the
    sustained-decode grid."""

    grid = load_grid(run)
    if not grid.groups:
        return Section("Goodput at SLO", text=["No decode cell was measured."], anchor="goodput")
    req = figure_grid(run, "slo_goodput_req_s")
    tok = figure_grid(run, "slo_goodput_tok_s")
    att = figure_grid(run, "slo_attainment")
    # a --search run measures only the loads it needs: its grid is sparse by design
    search = bool(((run.meta.get("run") or {}).get("matrix") or {}).get("search"))
    rows, classes, statuses, kinds = [], [], [], []
    below_any = flagged_any = skipped = False
    unjudged = 0
    for ctx, label in zip(grid.contexts, grid.labels):
        row: list[Any] = [label]
        cls = ["ctx"]
        for x, cells, st in grid.row(ctx):
            c = cell_class(st)
            if st is None and search:
                skipped = True
                row.append([fmt.DASH])
                cls.append(c)
                continue
            statuses.append(st)
            if st not in ("valid", "queued"):
                if st == "error":
                    kinds.append(error_kind(cells))
                row.append(status_lines(st, cells))
                cls.append(c)
                continue
            a = att.loc[label, x]
            goodput = (req.loc[label, x], tok.loc[label, x])
            lines, marks = _measured_lines(cells, st, goodput, a, s, grid.rate)
            unjudged += fmt.missing(a)
            below_any = below_any or "below" in marks
            flagged_any = flagged_any or "flagged" in marks
            row.append(lines)
            cls.append(" ".join([c, *marks]))
        rows.append(row)
        classes.append(cls)
    cols = ["Context"] + [f"{x:g}" if grid.rate else str(x) for x in grid.loads]
    what = "request rates (req/s)" if grid.rate else "simultaneous requests"
    first = "goodput req/s · goodput output tok/s" if grid.rate else "goodput output tok/s · req/s"
    caption = (
        f"{first} · share of requests meeting SLO {s.text} · "
        f"rows are context length, columns are {what}"
    )
    text = _goodput_text(grid.rate, s, below_any)
    text += status_notes(run, statuses, kinds, flagged_any)
    if skipped:
        text.append(f"{fmt.DASH}: a load the search (--search) did not need to measure.")
    if unjudged:
        text.append(UNJUDGED_NOTE.format(n=fmt.plural(unjudged, "measured cell")))
    items = [
        ("SLO", s.text + ("" if s.source == "run" else " (asked of this report; not the run's)")),
        ("Target attainment", share_text(s.attainment)),
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


def _measured_lines(
    cells: list[dict],
    status: str,
    goodput: tuple[Any, Any],
    attained: Any,
    s: SloSettings,
    rate: bool,
) -> tuple[list[str], list[str]]:
    """A measured grid cell's lines (goodput, attainment, the target missed most, flags) and
    its marks ("below", "flagged"), read from the cells' stored SLO figures and flags."""
    lines = _goodput_lines(goodput[0], goodput[1], rate)
    marks: list[str] = []
    if status == "queued":
        lines.append("Requests queued")
    if fmt.missing(attained):
        lines.append("no requests judged")
    else:
        lines.append(f"{share_text(attained)} met")
        if float(attained) < s.attainment:
            marks.append("below")
            worst = _failed_most(cells)
            lines.append(
                f"{BELOW_MARK} below {share_text(s.attainment)}" + (f": {worst}" if worst else "")
            )
    flags = cell_flags(cells)
    if flags:
        marks.append("flagged")
        lines.append(f"{fmt.FLAG_MARK} " + ", ".join(FLAG_SHORT.get(f, f) for f in flags))
    return lines, marks


def _goodput_text(rate: bool, s: SloSettings, below_any: bool) -> list[str]:
    text = [
        "Goodput counts only the requests that met every target of the SLO: completed "
        "requests meeting it per second of the window, and their output tokens per second. "
        "Attainment is the share of the window's requests that met it"
        + (
            " (judged from the scheduled time in an open-loop cell, what a user who arrived "
            "then waited)."
            if rate
            else "."
        )
    ]
    if below_any:
        text.append(
            f"{BELOW_MARK} Below target: fewer than {share_text(s.attainment)} of the cell's "
            "requests met the SLO; the target missed most is named (error: failed requests)."
        )
    return text


def _goodput_lines(req_s: Any, tok_s: Any, rate: bool) -> list[str]:
    """A grid cell's two goodput lines, the headline first: req/s for a request-rate run
    (requests complete in its window), output tok/s for a closed-loop one (whose long
    requests mostly run past the window: few complete in it, their tokens count)."""
    r, t = rate_text(req_s), fmt.tok_s(tok_s)
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


def slo_capacities(run: Run, s: SloSettings) -> dict[int, dict[str, Any]]:
    """`Run.capacity` for the report's SLO (computed once per report)."""
    if not s.caps:
        s.caps = run.capacity(s.targets, s.attainment)
    return s.caps


def slo_capacity_section(run: Run, s: SloSettings) -> Section:
    """The capacity answer per context: largest passing load, first failing, the interpolated
    estimate and its method (`Run.capacity`), and the chart of attainment against load."""
    caps = slo_capacities(run, s)
    search = (run.meta.get("run") or {}).get("search") or {}
    rows = []
    for ctx, cap in caps.items():
        rate = cap.get("by") == "rate"
        est_text = estimate_text(cap)
        points = ", ".join(f"{x:g}: {share_text(a)}" for x, a in cap.get("points") or [])
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
            f"{share_text(s.attainment)} of requests meeting it, judged from every cell's records "
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
        SLO_CAPACITY_TITLE,
        table=tbl if rows else None,
        text=text,
        anchor="capacity-at-slo",
        charts=["capacity_vs_load"] if rows else [],
    )


def estimate_text(cap: dict[str, Any]) -> str:
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
    caps = slo_capacities(run, s)
    if not caps:
        return []
    per = "; ".join(
        f"{cap.get('label') or fmt.context_label(ctx)}: {estimate_text(cap)}"
        for ctx, cap in caps.items()
    )
    return [
        (
            SLO_CAPACITY_TITLE,
            f"{per} (SLO {s.text} met by {share_text(s.attainment)} of requests; see Capacity at SLO)",
        )
    ]
