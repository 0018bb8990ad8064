"""The measurement sections: prefill, the sustained-decode grid, every measurement,
confidence intervals and tails, flags, the server's own view, errors and the cells not
measured. Each reads the cells' stored figures and verdicts and words them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from speedmatrix.redact import redact
from speedmatrix.report import formatting as fmt
from speedmatrix.report import predicted
from speedmatrix.report.cells import (
    FLAG_SHORT,
    FLAG_TEXT,
    by_rate,
    cell_flags,
    cell_lines,
    decode_cells,
    error_kind,
    load_header,
    load_of,
    missing_cells,
    ordered_cells,
    status_notes,
)
from speedmatrix.report.model import Section, Table
from speedmatrix.report.rates import rate_decode_section

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


def prefill_section(run: Run) -> Section:
    pre = run.prefill()
    rows, classes = [], []
    for _, p in pre.iterrows():
        st = p["status"]
        if st in (None, "over_capacity", "error") or fmt.missing(p["prompt_tok_s"]):
            status = fmt.status_text(st) if st else "Not measured"
            rows.append([f"{p['label']} context", status, "", ""])
            classes.append(["", "status", "", ""])
            continue
        spread = fmt.DASH
        if int(p["repetitions"]) > 1 or not fmt.missing(p["prompt_tok_s_lo"]):
            spread = fmt.ci(p["prompt_tok_s_lo"], p["prompt_tok_s_hi"], fmt.tok_s_short)
        rows.append(
            [
                f"{p['label']} context",
                fmt.tok_s_short(p["prompt_tok_s"]),
                f"{fmt.ms(p['ttft_ms'])} TTFT",
                spread,
            ]
        )
        classes.append(["", "num", "sub", "sub"])
    cols = ["Context", "Prompt tok/s", "TTFT", "Range"]
    if all(r[3] in ("", fmt.DASH) for r in rows):  # one repetition each: no spread to show
        cols, rows, classes = cols[:3], [r[:3] for r in rows], [c[:3] for c in classes]
    tbl = Table(cols, rows, caption=fmt.PREFILL_CAPTION, classes=classes)
    text = [] if rows else ["No prefill cells were measured."]
    return Section("Prefill", table=tbl, text=text, anchor="prefill", charts=["prefill_vs_context"])


def decode_section(run: Run) -> Section:
    if by_rate(run):
        return rate_decode_section(run)
    tot = run.table("total_tok_s")
    ttft = run.table("ttft_ms")
    err = run.table("errors_total", all_cells=True) if "errors_total" in run.cells else None
    st = run.statuses()
    groups = decode_cells(run)
    md = run.matrix_definition
    rows, classes, kinds, flagged, guessed = [], [], [], False, False
    for i, label in enumerate(tot.index):
        row: list[Any] = [str(label)]
        cls = ["ctx"]
        for j, n in enumerate(tot.columns):
            s = st.iat[i, j]
            e = err.iat[i, j] if err is not None else None
            cells = groups.get((int(md["contexts"][i]), int(n)), [])
            flags = cell_flags(cells)
            kind = error_kind(cells) if s == "error" else ""
            if kind:
                kinds.append(kind)
            flagged = flagged or bool(flags and s in ("valid", "queued"))
            c = {
                "over_capacity": "over",
                "queued": "queued",
                "error": "error",
                None: "missing",
            }.get(s, "valid")
            if predicted.any_predicted(cells):  # never shown as measured
                guessed = True
                row.append(predicted.grid_lines(s, cells))
                cls.append(c + " predicted")
                continue
            row.append(cell_lines(s, tot.iat[i, j], ttft.iat[i, j], e, flags, kind or "failed"))
            if flags and s in ("valid", "queued"):
                c += " flagged"
            cls.append(c)
        rows.append(row)
        classes.append(cls)
    statuses = list(st.to_numpy().ravel())
    tbl = Table(
        ["Context"] + [str(c) for c in tot.columns],
        rows,
        caption=fmt.MATRIX_CAPTION,
        note=fmt.legend(statuses),
        classes=classes,
    )
    text = [fmt.TTFT_NOTE] + status_notes(run, statuses, kinds, flagged)
    if guessed:
        text.append(predicted.legend(run))
    return Section(
        "Sustained decode",
        table=tbl,
        text=text,
        anchor="sustained-decode",
        charts=["decode_heatmap"],
    )


def _all_row(c: dict) -> list[str]:
    if predicted.is_predicted(c):
        return _predicted_row(c)
    phase = c.get("phase")
    status = c.get("status")
    if status == "over_capacity" or (status == "error" and phase == "decode"):
        # an error cell's figures are not reported (see the Sustained decode notes)
        return [
            fmt.phase_text(phase),
            c["label"],
            load_of(c),
            fmt.status_text(status),
        ] + [fmt.DASH] * 8
    if phase == "prefill":
        return [
            fmt.phase_text(phase),
            c["label"],
            load_of(c),
            fmt.status_text(status),
            fmt.tok_s(c.get("prompt_tok_s")),
            fmt.DASH,
            fmt.ms(c.get("ttft_ms")),
            fmt.DASH,
            fmt.DASH,
            fmt.count(c.get("completed")),
            fmt.DASH,
            fmt.DASH,
        ]
    return [
        fmt.phase_text(phase),
        c["label"],
        load_of(c),
        fmt.status_text(status),
        fmt.tok_s(c.get("total_tok_s")),
        fmt.tok_s(c.get("per_request_tok_s")),
        fmt.ms(c.get("ttft_ms")),
        fmt.ms1(c.get("tbt_ms")),
        fmt.one(c.get("avg_active")),
        fmt.count(c.get("completed")),
        fmt.count(c.get("output_tokens")),
        fmt.seconds(c.get("measured_s")),
    ]


def _predicted_row(c: dict) -> list[str]:
    """A predicted cell in the table of measurements: its status and figures marked, no
    measured time, nothing the model does not predict."""
    mark = f" ({predicted.PREDICTED_MARK})"
    row = [fmt.phase_text(c.get("phase")), c["label"], load_of(c)]
    row.append(fmt.status_text(c.get("status")) + mark)
    if c.get("status") == "over_capacity":
        return row + [fmt.DASH] * 8
    row += [fmt.tok_s(c.get("total_tok_s")) + mark, fmt.tok_s(c.get("per_request_tok_s"))]
    row += [fmt.DASH, fmt.ms1(c.get("tbt_ms")) + mark]
    return row + [fmt.one(c.get("avg_active")), fmt.DASH, fmt.DASH, fmt.DASH]


def all_section(run: Run) -> Section:
    cells = ordered_cells(run)
    rows = [_all_row(c) for c in cells]
    classes = [["txt", "txt", "", "txt"] + [""] * 8 for _ in rows]
    cols = list(fmt.ALL_COLUMNS)
    cols[2] = load_header(run)
    reps = [c.get("repetition") for c in cells]
    # repeated cells: say which
    if any(r is not None and not fmt.missing(r) and int(r) > 0 for r in reps):
        cols.append("Repetition")
        for row, cl, r in zip(rows, classes, reps):
            row.append(fmt.DASH if r is None or fmt.missing(r) else str(int(r) + 1))
            cl.append("")
    tbl = Table(
        cols,
        rows,
        caption=fmt.ALL_CAPTION,
        note=fmt.legend(c.get("status") for c in cells),
        classes=classes,
    )
    text = [predicted.legend(run)] if predicted.any_predicted(cells) else []
    return Section("All measurements", table=tbl, text=text, anchor="all-measurements")


def ci_section(run: Run) -> Section:
    rows = []
    for c in ordered_cells(run):
        if c["phase"] != "decode" or c["status"] in ("over_capacity", "error"):
            continue  # no figures are reported for these
        rows.append(
            [
                c["label"],
                load_of(c),
                fmt.status_text(c["status"]),
                fmt.tok_s(c.get("total_tok_s")),
                fmt.ci(c.get("total_tok_s_lo"), c.get("total_tok_s_hi"), fmt.tok_s),
                fmt.tok_s(c.get("per_request_tok_s")),
                fmt.ci(c.get("per_request_tok_s_lo"), c.get("per_request_tok_s_hi"), fmt.tok_s),
                fmt.tok_s(c.get("decode_tok_s_per_request")),
                fmt.ci(
                    c.get("decode_tok_s_per_request_lo"),
                    c.get("decode_tok_s_per_request_hi"),
                    fmt.tok_s,
                ),
                fmt.ci(c.get("ttft_ms_lo"), c.get("ttft_ms_hi"), fmt.ms),
                fmt.ms(c.get("ttft_p90_ms")),
                fmt.ms(c.get("ttft_p99_ms")),
                fmt.ci(c.get("tbt_ms_lo"), c.get("tbt_ms_hi"), fmt.ms1),
                fmt.ms1(c.get("tbt_p90_ms")),
                fmt.ms1(c.get("tbt_p99_ms")),
                fmt.percent(c.get("drift")),
            ]
        )
    cols = [
        "Context",
        load_header(run),
        "Status",
        "Total tok/s",
        "95% CI",
        "Per request tok/s",
        "95% CI",
        "Decode tok/s per request",
        "95% CI",
        "TTFT 95% CI",
        "TTFT p90",
        "TTFT p99",
        "Time between tokens 95% CI",
        "TBT p90",
        "TBT p99",
        "Drift",
    ]
    tbl = Table(
        cols,
        rows,
        caption=(
            "95% confidence intervals from per-second bins of each window (t-interval); "
            "p90/p99 are tails over the window's requests and tokens; drift is the relative change "
            "of throughput across the window. Per request tok/s is the seed's column, 1000 / the "
            "median time between tokens; decode tok/s per request is the median over requests of "
            "(tokens after the first) / (last − first token time), which stays right when a "
            "server sends several tokens per chunk (docs/metrics.md)."
        ),
        classes=[["txt", "", "txt"] + [""] * 13 for _ in rows],
    )
    text = [] if rows else ["No decode cell was measured."]
    return Section(
        "Confidence intervals and tails",
        table=tbl,
        text=text,
        anchor="confidence-intervals",
        charts=["total_vs_concurrency", "per_request_vs_concurrency"],
    )


def flags_section(run: Run) -> Section:
    rows = []
    seen: list[str] = []
    for c in ordered_cells(run):
        flags = c.get("flags")
        flags = list(flags) if isinstance(flags, (list, tuple, np.ndarray)) else []
        pt = {k: c.get(f"prompt_tokens_{k}") for k in ("asked", "reported_min", "reported_max")}
        prompt = fmt.DASH
        if not fmt.missing(pt["asked"]):
            rep = [
                v
                for v in (pt["reported_min"], pt["reported_max"])
                if v is not None and not fmt.missing(v)
            ]
            if rep:
                lo, hi = int(min(rep)), int(max(rep))
                r = fmt.count(lo) if lo == hi else f"{fmt.count(lo)}–{fmt.count(hi)}"
                prompt = f"asked {fmt.count(pt['asked'])}, server counted {r}"
        if not flags and c.get("status") == "valid":
            continue
        if not flags and c.get("status") == "over_capacity":
            continue
        for f in flags:
            if f not in seen:
                seen.append(f)
        reason = c.get("reason")
        rows.append(
            [
                fmt.phase_text(c["phase"]),
                c["label"],
                load_of(c),
                fmt.status_text(c["status"]),
                ", ".join(FLAG_SHORT.get(f, f) for f in flags) or fmt.DASH,
                prompt if "prompt_mismatch" in flags else fmt.DASH,
                str(reason) if not fmt.missing(reason) else fmt.DASH,
            ]
        )
    tbl = Table(
        ["Phase", "Context", load_header(run), "Status", "Flags", "Prompt tokens", "Reason"],
        rows,
        caption="Cells that are flagged or not valid, and why.",
        note=" ".join(FLAG_TEXT.get(f, f) for f in seen),
    )
    text = [] if rows else ["No cell was flagged: every measured cell is valid."]
    return Section("Flags", table=tbl, text=text, anchor="flags")


def server_section(run: Run) -> Section:
    rows = []
    for c in ordered_cells(run):
        if c["phase"] != "decode" or c["status"] == "over_capacity":
            continue
        srv = [
            c.get(f"server_{k}")
            for k in ("running_mean", "running_max", "waiting_max", "kv_usage_max")
        ]
        kv = srv[3]
        rows.append(
            [
                c["label"],
                load_of(c),
                fmt.status_text(c["status"]),
                fmt.one(c.get("avg_active")),
                fmt.one(srv[0]),
                fmt.count(srv[1]),
                fmt.count(srv[2]),
                fmt.DASH if kv is None or fmt.missing(kv) else f"{float(kv) * 100:.1f}%",
            ]
        )
    have = any(any(x != fmt.DASH for x in r[4:]) for r in rows)
    tbl = Table(
        [
            "Context",
            load_header(run),
            "Status",
            "Average active (client)",
            "Running (server, mean)",
            "Running (server, max)",
            "Waiting (server, max)",
            "KV cache use (max)",
        ],
        rows,
        caption="The server's own view from /metrics, sampled during each window.",
    )
    text = [] if have else ["The server exposed no /metrics samples for these cells."]
    return Section("Server-side view", table=tbl if rows else None, text=text, anchor="server-view")


def _error_kinds(c: dict) -> str:
    """``kind × count`` per error kind, with the server's example message when the cell kept
    one (``error_examples``), redacted."""
    errs = c.get("errors")
    if not isinstance(errs, dict):
        errs = {}
    examples = c.get("error_examples")
    if not isinstance(examples, dict):
        examples = {}
    parts = []
    for k, v in sorted(errs.items()):
        text = f"{k} × {fmt.count(v)}"
        ex = examples.get(k)
        if not fmt.missing(ex):
            ex = " ".join(redact(str(ex)).split())
            text += f" (e.g. “{ex if len(ex) <= 200 else ex[:199] + '…'}”)"
        parts.append(text)
    return "; ".join(parts) if examples else ", ".join(parts)


def errors_section(run: Run) -> Section | None:
    rows = []
    for c in ordered_cells(run):
        errs = c.get("errors")
        if not isinstance(errs, dict) or not errs:
            continue
        rows.append(
            [
                fmt.phase_text(c["phase"]),
                c["label"],
                load_of(c),
                fmt.status_text(c["status"]),
                fmt.count(sum(errs.values())),
                _error_kinds(c),
            ]
        )
    if not rows:
        return None
    return Section(
        "Errors",
        table=Table(
            ["Phase", "Context", load_header(run), "Status", "Failed requests", "By kind"],
            rows,
            caption="Failed requests by kind, with an example "
            "of the server's message where one was "
            "kept.",
        ),
        anchor="errors",
    )


def missing_section(run: Run) -> Section | None:
    miss = missing_cells(run)
    if not miss:
        return None
    rows = [[fmt.phase_text(p), fmt.context_label(c), n] for p, c, n in miss]
    return Section(
        "Not measured",
        table=Table(
            ["Phase", "Context", load_header(run)],
            rows,
            caption="Cells of the matrix this run never reached.",
        ),
        anchor="not-measured",
    )
