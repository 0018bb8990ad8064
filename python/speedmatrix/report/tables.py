"""The report's content, independent of the output format (Markdown and HTML render it).

Over 500 lines: every table of the report is built here from one `Run`, so that Markdown
and HTML cannot disagree about what a table holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from speedmatrix import verdict_preemption as _vp
from speedmatrix.naming import display_model_name, precision_label
from speedmatrix.redact import redact
from speedmatrix.report import formatting as fmt

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

FLAG_TEXT = {
    "busy_at_start": "Busy at start: the server was not idle when the cell began.",
    "drift": "Drift: throughput changed significantly across the window.",
    "prompt_mismatch": "Prompt mismatch: the server counted a different prompt length than asked.",
    "estimated_tokens": (
        "Estimated tokens: output tokens were counted one per streamed chunk, not taken "
        "from the server's usage, so they can read low where a chunk carries several tokens."
    ),
    "client_bound": "Client bound: the benchmark client was busy enough to limit the figures.",
    "interrupted": "Interrupted: the run stopped during or after this cell.",
    "server_running_mismatch": (
        "Server running mismatch: the server ran more requests than the "
        "cell sent (work left over from earlier cells)."
    ),
    "long_ramp": (
        "Long ramp: the N requests did not all stream (nor settle at a plateau) before "
        "the ramp cap, so the window opened before steady state and the figures may "
        "read lower."
    ),
    "stalls": (
        "Stalls: streams went silent mid-window and were cut and replaced (errors.stall); "
        "the figures are those of the other streams."
    ),
    "ttft_unserved": (
        "TTFT reads low: requests sent in the window were still waiting for their "
        "first token when it ended, longer than the median TTFT, which counts only "
        "the requests that got one (see the cell's ttft_unserved)."
    ),
    "output_not_forced": (
        "Output not forced: the server cannot be told to ignore end-of-sequence, "
        "so requests may end early and be replaced (more prefill in the window)."
    ),
    "rate_limited": (
        "Rate limited: the server answered 429 Too Many Requests (errors.http_429); each "
        "slot waited as it asked (Retry-After, at most 10 s) or backed off (backoffs, "
        "backoff_s), so the figures are those of a throttled client, not the server's capacity."
    ),
    "behind": (
        "Server could not keep up: at this request rate the backlog grew through the "
        "window (latency from the scheduled time grew, or arrivals were unfinished at "
        "the drain bound; see the cell's open_loop.reason)."
    ),
}
FLAG_TEXT[_vp.FLAG] = _vp.FLAG_TEXT
FLAG_SHORT = {
    _vp.FLAG: _vp.FLAG_SHORT,
    "busy_at_start": "Busy at start",
    "drift": "Drift",
    "prompt_mismatch": "Prompt mismatch",
    "estimated_tokens": "Estimated tokens",
    "client_bound": "Client bound",
    "interrupted": "Interrupted",
    "server_running_mismatch": "Server running mismatch",
    "long_ramp": "Long ramp",
    "stalls": "Stalls",
    "output_not_forced": "Output not forced",
    "ttft_unserved": "TTFT reads low",
    "behind": "Server could not keep up",
    "rate_limited": "Rate limited",
}
CAPACITY_NAMES = {
    "kv_tokens": "KV cache capacity",
    "context_length": "Context length",
    "max_running": "Max running requests",
}
CAPACITY_SOURCE_TEXT = {
    "probed": "Probed from the server",
    "given": "Given by the user",
    "default": "Default",
    "missing": "Not available",
}


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]  # a cell is a str or a list of str (stacked lines)
    caption: str = ""
    note: str = ""
    classes: list[list[str]] = field(default_factory=list)  # per-row css classes per cell


@dataclass
class Section:
    title: str
    items: list[tuple[str, str]] | None = None  # definition list
    table: Table | None = None
    text: list[str] = field(default_factory=list)  # paragraphs after the table
    code: str | None = None
    anchor: str = ""
    charts: list[str] = field(default_factory=list)  # names of charts shown in this section
    css: str = ""  # the table's style ("matrix" for a grid of stacked cells); "" = by title


@dataclass
class Report:
    title: str
    subtitle: str
    engine_line: str
    matrix_line: str
    notes: list[str]
    sections: list[Section]


def _get(d: dict | None, *keys: str) -> Any:
    for k in keys:
        if d and not fmt.missing(d.get(k)):
            return d.get(k)
    return None


def model_name(meta: dict) -> str:
    """The model in the title: the name the run recorded (given with ``--model-name`` or
    derived from the model path), else the last part of a recorded model path, else the
    served name."""
    run, target, eng = meta.get("run") or {}, meta.get("target") or {}, meta.get("engine") or {}
    path = _get(target, "model_path") or _get(eng, "model_path")
    return str(
        _get(target, "model_name")
        or _get(run, "model_name")
        or display_model_name(path)
        or _get(target, "model")
        or _get(run, "served_model", "model")
        or "Unknown model"
    )


def simulated(meta: dict) -> bool:
    """True for a run against the built-in engine (speedmatrix-sim)."""
    eng, hw = meta.get("engine") or {}, meta.get("hardware") or {}
    return bool(eng.get("simulated")) or str(hw.get("type") or "").lower() == "simulated"


def engine_name(meta: dict) -> str | None:
    """The engine as the report names it; the built-in engine says it is a simulation of
    that engine, so a demo run never reads as a real SGLang or vLLM."""
    name = _get(meta.get("engine"), "name")
    if name is None:
        return None
    return f"{name} (simulated by speedmatrix-sim)" if simulated(meta) else str(name)


def precision(eng: dict) -> str | None:
    """The seed's "Quantization" value: the quantization method, else the weights' dtype
    (BF16 for ``bfloat16``; nothing for ``auto``)."""
    quant = _get(eng, "quantization")
    return str(quant) if quant is not None else precision_label(eng.get("dtype"))


def hardware_name(meta: dict) -> str:
    """``H200 NVL 141GB`` as the seed's title writes it (GPU, then its memory)."""
    hw = meta.get("hardware") or {}
    gpu = _get(hw, "gpu")
    if gpu is None:
        if simulated(meta):
            return "speedmatrix-sim (simulated)"
        return str(_get(hw, "cpu") or "unknown hardware")
    vram = _vram(hw)
    if vram and vram.endswith(" GB") and not str(gpu).endswith("GB"):
        return f"{gpu} {vram[:-3]}GB"
    return str(gpu)


def _items(pairs: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    return [(k, str(v)) for k, v in pairs if not fmt.missing(v)]


def header_lines(run: Run) -> tuple[str, str, str, str]:
    meta = run.meta
    eng = meta.get("engine") or {}
    title = "Speed test matrix"
    subtitle = f"{model_name(meta)} on {hardware_name(meta)}"
    parts = [
        str(v)
        for v in (engine_name(meta), eng.get("version"), precision(eng))
        if not fmt.missing(v)
    ]
    engine_line = " · ".join(parts) if parts else "unknown engine"
    md = run.matrix_definition
    ctx, conc, pre = md["contexts"], md["concurrency"], md["prefill_contexts"]
    pieces = []
    if ctx or conc:
        pieces.append(
            f"{fmt.plural(len(ctx), 'context')} {fmt.range_text(ctx, fmt.context_label)} × "
            f"{fmt.plural(len(conc), 'concurrency level')} {fmt.range_text(conc)}".replace(
                "  ", " "
            ).strip()
        )
    if pre:
        pieces.append("prefill at " + ", ".join(fmt.context_label(c) for c in pre))
    return title, subtitle, engine_line, " · ".join(pieces)


def _vram(hw: dict) -> str | None:
    v = hw.get("vram_gb")
    if fmt.missing(v):
        v = hw.get("vram")
    if v is None or fmt.missing(v):
        return None
    try:
        return fmt.gigabytes(float(v))
    except (TypeError, ValueError):
        return str(v)


def hardware_section(run: Run) -> Section:
    hw = run.meta.get("hardware") or {}
    items = _items(
        [
            ("Type", fmt.code_text(hw.get("type")) if hw.get("type") else None),
            ("GPU", hw.get("gpu")),
            ("VRAM", _vram(hw)),
            ("OS", hw.get("os")),
            ("CPU", hw.get("cpu")),
        ]
    )
    return Section("Hardware", items=items or [("Type", "Not recorded")], anchor="hardware")


def engine_section(run: Run) -> Section:
    e = run.meta.get("engine") or {}
    t = run.meta.get("target") or {}
    items = _items(
        [
            ("Engine", engine_name(run.meta)),
            ("Version", e.get("version")),
            ("Quantization", precision(e)),
            ("Backend", e.get("backend")),
            ("Repository", e.get("repository")),
            ("Build", e.get("build")),
            ("Commit", e.get("commit")),
            ("Model path", t.get("model_path") or e.get("model_path")),
            ("Tensor parallel", e.get("tp_size")),
        ]
    )
    return Section("Engine", items=items or [("Engine", "Not recorded")], anchor="engine")


def run_section(run: Run) -> Section:
    r = run.meta.get("run") or {}
    t = run.meta.get("target") or {}
    tool = r.get("tool")
    if tool and r.get("tool_version"):
        tool = f"{tool} v{r['tool_version']}"
    status = None
    if r.get("interrupted"):
        status = "Interrupted"
    items = _items(
        [
            ("Served model", r.get("served_model") or t.get("model")),
            ("Revision", r.get("revision")),
            ("Benchmark tool", tool),
            ("Decode test", fmt.code_text(r["decode_test"]) if r.get("decode_test") else None),
            ("Prefill mode", fmt.code_text(r["prefill_mode"]) if r.get("prefill_mode") else None),
            (
                "Time per measurement",
                fmt.plain_seconds(r["duration_s"])
                if not fmt.missing(r.get("duration_s"))
                else None,
            ),
            (
                "Max output",
                fmt.tokens(r["max_output"]) if not fmt.missing(r.get("max_output")) else None,
            ),
            ("API", t.get("api")),
            ("Target", redact(str(t["url"])) if t.get("url") else None),
            ("Started", r.get("started_at")),
            ("Finished", r.get("finished_at")),
            ("Status", status),
        ]
    )
    return Section("Run", items=items, anchor="run")


def launch_section(run: Run) -> Section:
    cmd = (run.meta.get("run") or {}).get("launch_command")
    if fmt.missing(cmd):
        return Section("Launch command", text=["Not given."], anchor="launch-command")
    return Section("Launch command", code=redact(str(cmd)), anchor="launch-command")


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


def error_kind(cells: list[dict]) -> str:
    """Why a cell is `error`: ``not_run`` (the server stopped answering before it),
    ``failed`` (it ran and too many of its requests failed) or ``unmeasured`` (it could not
    be measured at all: no prompts, no window, no output)."""
    if any(not fmt.missing(c.get("not_run")) for c in cells):
        return "not_run"
    for c in cells:
        errs = c.get("errors_total")
        ran = not fmt.missing(c.get("measured_s")) and float(c.get("measured_s") or 0) > 0
        if errs is not None and not fmt.missing(errs) and int(errs) > 0 and ran:
            return "failed"
    return "unmeasured"


def cell_flags(cells: list[dict]) -> list[str]:
    """The flags of a matrix cell's reported repetitions (valid and queued), in first-seen
    order."""
    out: list[str] = []
    for c in cells:
        if c.get("status") not in ("valid", "queued"):
            continue
        flags = c.get("flags")
        for f in list(flags) if isinstance(flags, (list, tuple, np.ndarray)) else []:
            if f not in out:
                out.append(str(f))
    return out


def decode_cells(run: Run) -> dict[tuple[int, int], list[dict]]:
    """The decode cells of each (context, concurrency), repetitions together."""
    out: dict[tuple[int, int], list[dict]] = {}
    for c in ordered_cells(run):
        if c.get("phase") == "decode":
            out.setdefault((int(c["context"]), int(c["concurrency"])), []).append(c)
    return out


def cell_lines(
    status: str | None,
    total: Any,
    ttft: Any,
    errors_total: Any,
    flags: list[str] | None = None,
    error_kind: str = "failed",
) -> list[str]:
    if status is None:
        return ["Not measured"]
    if status == "over_capacity":
        return ["Over capacity"]
    if status == "error":
        if error_kind == "not_run":
            return ["Not run"]
        lines = ["Error"]
        if error_kind == "failed" and not fmt.missing(errors_total) and int(errors_total):
            lines.append(f"{fmt.count(errors_total)} failed")
        elif error_kind == "unmeasured":
            lines.append("not measured")
        return lines
    lines = [fmt.tok_s(total)]
    if status == "queued":
        lines.append("Requests queued")
    lines.append(f"{fmt.ms(ttft)} TTFT")
    if flags:
        lines.append(f"{fmt.FLAG_MARK} " + ", ".join(FLAG_SHORT.get(f, f) for f in flags))
    return lines


def status_notes(run: Run, statuses: list[Any], kinds: list[str], flagged: bool) -> list[str]:
    """The sentences that explain the grid's marks, one per kind of mark present."""
    text = []
    if flagged:
        text.append(fmt.FLAGGED_LEGEND)
    if "failed" in kinds:
        text.append(fmt.ERROR_FAILED_LEGEND)
    if "unmeasured" in kinds:
        text.append(fmt.ERROR_UNMEASURED_LEGEND)
    if "not_run" in kinds:
        text.append(fmt.NOT_RUN_LEGEND)
    if any(s is None for s in statuses):
        text.append(fmt.NOT_MEASURED_LEGEND)
    return text


def decode_section(run: Run) -> Section:
    from speedmatrix.report import goodput

    if goodput.by_rate(run):
        return goodput.rate_decode_section(run)
    tot = run.table("total_tok_s")
    ttft = run.table("ttft_ms")
    err = run.table("errors_total", all_cells=True) if "errors_total" in run.cells else None
    st = run.statuses()
    groups = decode_cells(run)
    md = run.matrix_definition
    rows, classes, kinds, flagged = [], [], [], False
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
            row.append(cell_lines(s, tot.iat[i, j], ttft.iat[i, j], e, flags, kind or "failed"))
            c = {
                "over_capacity": "over",
                "queued": "queued",
                "error": "error",
                None: "missing",
            }.get(s, "valid")
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
    return Section(
        "Sustained decode",
        table=tbl,
        text=text,
        anchor="sustained-decode",
        charts=["decode_heatmap"],
    )


def _all_row(c: dict) -> list[str]:
    phase = c.get("phase")
    status = c.get("status")
    if status == "over_capacity" or (status == "error" and phase == "decode"):
        # an error cell's figures are not reported (see the Sustained decode notes)
        return [
            fmt.phase_text(phase),
            c["label"],
            _load(c),
            fmt.status_text(status),
        ] + [fmt.DASH] * 8
    if phase == "prefill":
        return [
            fmt.phase_text(phase),
            c["label"],
            _load(c),
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
        _load(c),
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


def _load(c: dict) -> str:
    """A cell's load as the tables show it: requests at once, or the request rate of an
    open-loop cell (whose concurrency is only its gate)."""
    rate: Any = c.get("rate_per_s")
    if not fmt.missing(rate):
        return f"{float(rate):g} req/s"
    return fmt.count(c.get("concurrency"))


def _load_header(run: Run) -> str:
    from speedmatrix.report.goodput import by_rate

    return "Load (requests at once or req/s)" if by_rate(run) else "Requests at once"


def ordered_cells(run: Run) -> list[dict]:
    df = run.cells
    if df.empty:
        return []
    order = {"prefill": 0, "decode": 1}
    df = df.assign(_p=df["phase"].map(order).fillna(2))
    keys = ["_p", "context", "concurrency", "repetition"]
    if "rate_per_s" in df:  # an open-loop run: its cells by rate (concurrency is the gate)
        keys.insert(3, "rate_per_s")
    df = df.sort_values(keys, kind="stable")
    return [r.to_dict() for _, r in df.iterrows()]


def all_section(run: Run) -> Section:
    cells = ordered_cells(run)
    rows = [_all_row(c) for c in cells]
    classes = [["txt", "txt", "", "txt"] + [""] * 8 for _ in rows]
    cols = list(fmt.ALL_COLUMNS)
    cols[2] = _load_header(run)
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
    return Section("All measurements", table=tbl, anchor="all-measurements")


def ci_section(run: Run) -> Section:
    rows = []
    for c in ordered_cells(run):
        if c["phase"] != "decode" or c["status"] in ("over_capacity", "error"):
            continue  # no figures are reported for these
        rows.append(
            [
                c["label"],
                _load(c),
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
        _load_header(run),
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
                _load(c),
                fmt.status_text(c["status"]),
                ", ".join(FLAG_SHORT.get(f, f) for f in flags) or fmt.DASH,
                prompt if "prompt_mismatch" in flags else fmt.DASH,
                str(reason) if not fmt.missing(reason) else fmt.DASH,
            ]
        )
    tbl = Table(
        ["Phase", "Context", _load_header(run), "Status", "Flags", "Prompt tokens", "Reason"],
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
                _load(c),
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
            _load_header(run),
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


def capacity_section(run: Run) -> Section:
    cap = run.meta.get("capacity") or {}
    rows = []
    for k, v in cap.items():
        if isinstance(v, dict):
            val, src = v.get("value"), v.get("source")
        else:
            val, src = v, None
        name = CAPACITY_NAMES.get(k, k.replace("_", " ").capitalize())
        shown = (
            fmt.count(val)
            if isinstance(val, (int, float)) and not fmt.missing(val)
            else (fmt.DASH if fmt.missing(val) else str(val))
        )
        if k in ("kv_tokens", "context_length") and shown != fmt.DASH:
            shown += " tokens"
        detail = v.get("detail") if isinstance(v, dict) else None
        source = fmt.code_text(src)  # a dash when the source was not recorded
        if isinstance(src, str):
            source = CAPACITY_SOURCE_TEXT.get(src, source)
        rows.append([name, shown, source, fmt.DASH if fmt.missing(detail) else str(detail)])
    tbl = Table(
        ["Value", "Used", "Source", "Detail"],
        rows,
        caption="What the plan used, and whether it was probed from the server or given.",
    )
    text = [] if rows else ["No capacity values were recorded."]
    return Section("Capacity", table=tbl if rows else None, text=text, anchor="capacity")


SOURCE_TEXT = {
    "probed": "Probed from the server",
    "given": "Given by the user",
    "detected": "Detected on this machine",
    "default": "Default",
    "missing": "Not available",
    "model_path": "From the model path the server reports",
    "served_model": "The served model name",
}
ENGINE_FACTS = (
    ("name", "Engine"),
    ("version", "Version"),
    ("commit", "Commit"),
    ("quantization", "Quantization"),
    ("backend", "Backend"),
    ("build", "Build"),
    ("repository", "Repository"),
)
HARDWARE_FACTS = (
    ("type", "Type"),
    ("gpu", "GPU"),
    ("vram_gb", "VRAM"),
    ("os", "OS"),
    ("cpu", "CPU"),
)


def _source_text(src: Any) -> str:
    return SOURCE_TEXT.get(src, fmt.code_text(src)) if not fmt.missing(src) else fmt.DASH


def sources_section(run: Run) -> Section | None:
    """Where the model name, the engine facts and the hardware came from (probed, detected or
    given); capacity has its own table. None for runs that recorded no sources."""
    meta = run.meta
    t, e, hw = meta.get("target") or {}, meta.get("engine") or {}, meta.get("hardware") or {}
    rows = []
    name_source = t.get("model_name_source")
    if not name_source and not t.get("model_name") and (t.get("model_path") or e.get("model_path")):
        name_source = "model_path"  # the title derives it here (see model_name)
    if name_source:
        rows.append(["Model", "Name", model_name(meta), _source_text(name_source)])
    e_src = e.get("sources")
    if not isinstance(e_src, dict):
        e_src = {}
    for key, label in ENGINE_FACTS:
        value = engine_name(meta) if key == "name" else e.get(key)
        if key in e_src and not fmt.missing(value):
            rows.append(["Engine", label, str(value), _source_text(e_src[key])])
    h_src = hw.get("sources")
    if not isinstance(h_src, dict):
        h_src = {}
    for key, label in HARDWARE_FACTS:
        value = _vram(hw) if key == "vram_gb" else hw.get(key)
        if key in h_src and not fmt.missing(value):
            rows.append(["Hardware", label, str(value), _source_text(h_src[key])])
    if not rows:
        return None
    return Section(
        "Probed and given",
        table=Table(
            ["Part", "Field", "Value", "Source"],
            rows,
            caption="Where the report's metadata came from: probed from the server, detected on "
            "the machine, or given by the user.",
        ),
        anchor="sources",
    )


def warnings_section(run: Run) -> Section | None:
    """The run's warnings (discovery, plan): None when there are none."""
    warns = run.meta.get("warnings")
    if isinstance(warns, str):
        warns = [warns]
    if not isinstance(warns, (list, tuple)):
        return None
    items = [redact(str(w)).strip() for w in warns if not fmt.missing(w) and str(w).strip()]
    if not items:
        return None
    return Section("Warnings", text=items, anchor="warnings")


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
                _load(c),
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
            ["Phase", "Context", _load_header(run), "Status", "Failed requests", "By kind"],
            rows,
            caption="Failed requests by kind, with an example "
            "of the server's message where one was "
            "kept.",
        ),
        anchor="errors",
    )


def _missing(run: Run) -> list[tuple[str, int, str]]:
    """(phase, context, load text) of the matrix's cells the run never reached."""
    by_rate = bool(run.matrix_definition["request_rates"])
    return [
        (p, c, f"{n:g} req/s" if by_rate and p == "decode" else fmt.count(n))
        for p, c, n in run.missing_cells()
    ]


def missing_section(run: Run) -> Section | None:
    miss = _missing(run)
    if not miss:
        return None
    rows = [[fmt.phase_text(p), fmt.context_label(c), n] for p, c, n in miss]
    return Section(
        "Not measured",
        table=Table(
            ["Phase", "Context", _load_header(run)],
            rows,
            caption="Cells of the matrix this run never reached.",
        ),
        anchor="not-measured",
    )


#: the knee: the most requests at once whose per-request speed is still at least this share
#: of the context's single-stream (N = 1) speed
KNEE_SHARE = 0.5


def summary(run: Run) -> dict[str, Any]:
    """The answer first: peak total tok/s and where, single-stream speed, per context the knee
    (the most requests at once still getting ``KNEE_SHARE`` of single-stream speed each) and
    the capacity limit, and the flagged cells. Numbers only; :func:`summary_section` words
    them. Everything derives from the matrix pivots of :class:`Run`."""
    tot = run.table("total_tok_s")
    per = run.table("per_request_tok_s")
    st = run.statuses()
    md = run.matrix_definition
    conc = [int(n) for n in tot.columns]
    out: dict[str, Any] = {"peak": None, "contexts": [], "flagged": {}, "n_flagged": 0}
    vals = tot.to_numpy(float)
    if vals.size and np.isfinite(vals).any():
        pi, pj = np.unravel_index(np.nanargmax(vals), vals.shape)
        out["peak"] = {
            "total_tok_s": float(vals[pi, pj]),
            "context": int(md["contexts"][pi]),
            "label": str(tot.index[pi]),
            "concurrency": conc[pj],
        }
    for i, label in enumerate(tot.index):
        row_per = per.iloc[i].to_numpy(float)
        row_tot = tot.iloc[i].to_numpy(float)
        row_st = list(st.iloc[i])
        single = float(row_per[0]) if conc and conc[0] == 1 else float("nan")
        knee = None
        if np.isfinite(single) and single > 0:
            for n, v in zip(conc, row_per):
                if not np.isfinite(v) or v < KNEE_SHARE * single:
                    break
                knee = n
        fits = [n for n, s in zip(conc, row_st) if s in ("valid", "queued")]
        over = [n for n, s in zip(conc, row_st) if s == "over_capacity"]
        queued = [n for n, s in zip(conc, row_st) if s == "queued"]
        best = int(np.nanargmax(row_tot)) if np.isfinite(row_tot).any() else None
        out["contexts"].append(
            {
                "label": str(label),
                "context": int(md["contexts"][i]),
                "single_tok_s": single,
                "knee": knee,
                "peak_tok_s": float(row_tot[best]) if best is not None else float("nan"),
                "peak_at": conc[best] if best is not None else None,
                "largest_measured": max(fits) if fits else None,
                "first_over": min(over) if over else None,
                "first_queued": min(queued) if queued else None,
            }
        )
    for c in ordered_cells(run):
        flags = c.get("flags")
        flags = list(flags) if isinstance(flags, (list, tuple, np.ndarray)) else []
        if flags and c.get("status") in ("valid", "queued"):
            out["n_flagged"] += 1
            for f in flags:
                out["flagged"][f] = out["flagged"].get(f, 0) + 1
    return out


def summary_section(run: Run) -> Section:
    s = summary(run)
    items: list[tuple[str, str]] = []
    peak = s["peak"]
    if peak is None:
        items.append(("Peak throughput", "No decode cell was measured."))
    else:
        items.append(
            (
                "Peak throughput",
                (
                    f"{fmt.tok_s(peak['total_tok_s'])} total tok/s at {peak['label']} context × "
                    f"{fmt.plural(peak['concurrency'], 'request')} at once"
                ),
            )
        )
    singles = [(c["label"], c["single_tok_s"]) for c in s["contexts"]]
    singles = [(lab, v) for lab, v in singles if np.isfinite(v)]
    if singles:
        text = ", ".join(f"{fmt.tok_s(v)} at {lab}" for lab, v in singles)
        items.append(("Single-stream speed", f"{text} (tok/s of one request alone)"))
    n_cells = int(sum(1 for c in ordered_cells(run) if c.get("status") in ("valid", "queued")))
    if s["n_flagged"]:
        why = ", ".join(
            f"{FLAG_SHORT.get(f, f)} ({n})"
            for f, n in sorted(s["flagged"].items(), key=lambda kv: -kv[1])
        )
        items.append(
            (
                "Flagged cells",
                (
                    f"{s['n_flagged']} of {n_cells} measured cells "
                    f"({fmt.FLAG_MARK} in the grid): {why}; see Flags"
                ),
            )
        )
    else:
        items.append(("Flagged cells", f"None of {n_cells} measured cells"))
    rows = []
    for c in s["contexts"]:
        knee = fmt.DASH if c["knee"] is None else f"{fmt.count(c['knee'])} at once"
        if c["first_over"] is not None:
            limit = (
                f"{fmt.count(c['largest_measured'])} at once fit; "
                f"{fmt.count(c['first_over'])} over capacity"
                if c["largest_measured"] is not None
                else f"over capacity from {fmt.count(c['first_over'])}"
            )
        else:
            limit = "every level fits"
        if c["first_queued"] is not None:
            limit += f"; queued from {fmt.count(c['first_queued'])}"
        peak_txt = (
            fmt.DASH
            if c["peak_at"] is None
            else f"{fmt.tok_s(c['peak_tok_s'])} at {fmt.count(c['peak_at'])}"
        )
        rows.append([c["label"], fmt.tok_s(c["single_tok_s"]), knee, peak_txt, limit])
    share = f"{KNEE_SHARE:.0%}"
    tbl = Table(
        ["Context", "Single stream tok/s", "Knee", "Peak total tok/s", "Capacity limit"],
        rows,
        caption=(
            f"Per context: the knee is the most requests at once that still each get at least "
            f"{share} of the single-stream speed; the capacity limit is where the planner found "
            "the requests would not fit the server's KV cache."
        ),
        classes=[["txt", "", "txt", "", "txt"] for _ in rows],
    )
    return Section("Summary", items=items, table=tbl if rows else None, anchor="summary")


def build(run: Run, slo: Any = None) -> Report:
    """The report of ``run``; ``slo`` (`speedmatrix.report.goodput.SloSettings`, None for a
    run without an SLO) adds the goodput grid and the capacity answer."""
    from speedmatrix.report import goodput

    title, subtitle, engine_line, matrix_line = header_lines(run)
    if goodput.by_rate(run):
        matrix_line = goodput.rate_matrix_line(run)
    notes = []
    if run.interrupted:
        n_miss = len(_missing(run))
        notes.append(
            "This run was interrupted"
            + (f": {fmt.plural(n_miss, 'cell')} of the matrix not measured." if n_miss else ".")
        )
    warns = warnings_section(run)
    if warns is not None:
        notes.append(f"The run recorded {fmt.plural(len(warns.text), 'warning')}: see Warnings.")
    summ = summary_section(run)
    if goodput.by_rate(run):
        summ = goodput.rate_summary_section(run)
    if slo is not None:
        summ.items = (summ.items or []) + goodput.summary_items(run, slo)
    load_views = []
    if slo is not None:
        load_views += [goodput.goodput_section(run, slo), goodput.capacity_section(run, slo)]
    ol = goodput.open_loop_section(run)
    if ol is not None:
        load_views.append(ol)
    sections = [
        summ,
        hardware_section(run),
        engine_section(run),
        run_section(run),
        launch_section(run),
        prefill_section(run),
        decode_section(run),
        *load_views,
        all_section(run),
        ci_section(run),
        flags_section(run),
        server_section(run),
        capacity_section(run),
    ]
    for extra in (sources_section(run), warns, errors_section(run), missing_section(run)):
        if extra is not None:
            sections.append(extra)
    sections.append(
        Section(
            "Charts",
            anchor="charts",
            charts=["ttft_vs_context", "tbt_distribution", "throughput_over_time"],
        )
    )
    return Report(title, subtitle, engine_line, matrix_line, notes, sections)
