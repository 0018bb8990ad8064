"""Two runs side by side: every figure of every cell, the ratio b/a, and whether it is real.

    from speedmatrix.report.compare import compare, write_compare
    df = compare(sm.load("out/before"), sm.load("out/after"))
    write_compare("out/before", "out/after", "out/compare")

A difference counts as significant when the two 95% confidence intervals do
not overlap; where a cell has no intervals but both runs kept their records, a
Welch t-test over the per-second throughput bins decides (total tok/s).

Over 500 lines: the comparison of two runs (matching cells, significance, its own report)
is one feature read top to bottom.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from scipy import stats

from speedmatrix.report import formatting as fmt
from speedmatrix.report import html as html_mod
from speedmatrix.report import markdown as md_mod
from speedmatrix.report.metadata import hardware_name, model_name
from speedmatrix.report.model import Report, Section, Table
from speedmatrix.report.plots import figure_to_svg
from speedmatrix.results import combined_status, load
from speedmatrix.runfile import atomic_write

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

FIGURES = ("total_tok_s", "per_request_tok_s", "ttft_ms", "tbt_ms", "prompt_tok_s", "avg_active")
HIGHER_IS_BETTER = {
    "total_tok_s": True,
    "per_request_tok_s": True,
    "prompt_tok_s": True,
    "ttft_ms": False,
    "tbt_ms": False,
    "avg_active": True,
}
KEY = ["phase", "context", "concurrency"]


def t_critical(df: float) -> float:
    """Two-sided 95% critical value of Student's t with ``df`` degrees of freedom."""
    if not math.isfinite(df) or df <= 0:
        return math.nan

    return float(stats.t.ppf(0.975, df))


def welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, bool]:
    """Welch's t statistic of ``b`` against ``a``, its degrees of freedom, and whether the
    difference is significant at 95% (scipy.stats.ttest_ind with unequal variances)."""

    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan, False
    if a.var(ddof=1) + b.var(ddof=1) == 0:  # no spread: any difference of means is real
        differ = bool(a.mean() != b.mean())
        return (math.inf if differ else 0.0), math.inf, differ
    res = stats.ttest_ind(b, a, equal_var=False)
    return float(res.statistic), float(res.df), bool(res.pvalue < 0.05)


def _agg(run: Run) -> pd.DataFrame:
    """One row per (phase, context, concurrency): medians over repetitions, widest CI."""

    c = run.cells
    if c.empty:
        return pd.DataFrame(columns=KEY)
    rows = []
    for key, g in c.groupby(KEY, sort=True):
        row = dict(zip(KEY, key))
        row["label"] = g["label"].iloc[0]
        row["status"] = combined_status(g["status"].tolist())
        row["ids"] = list(g["id"])
        for f in FIGURES:
            if f in g:
                v = pd.to_numeric(g[f], errors="coerce")
                row[f] = float(v.median()) if v.notna().any() else np.nan
            else:
                row[f] = np.nan
            lo, hi = f"{f}_lo", f"{f}_hi"
            row[lo] = float(g[lo].min()) if lo in g and g[lo].notna().any() else np.nan
            row[hi] = float(g[hi].max()) if hi in g and g[hi].notna().any() else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _bins(run: Run, ids: list[str]) -> np.ndarray:
    out = []
    for cid in ids if isinstance(ids, list) else []:
        try:
            out.append(run.bins(cid))
        except (KeyError, FileNotFoundError, ValueError):
            continue
    return np.concatenate(out) if out else np.zeros(0)


def compare(run_a: Run, run_b: Run) -> pd.DataFrame:
    """Per cell (phase, context, concurrency): each figure in a and b, ratio b/a, significance.

    Columns: ``phase, context, concurrency, label, status_a, status_b, status_changed``, and
    per figure ``<f>_a, <f>_b, <f>_ratio, <f>_significant, <f>_method, <f>_better``
    (``method`` is "ci", "welch" or None; ``better`` is True when b improves on a,
    respecting that lower TTFT/TBT is better, and None when not significant).
    """
    a, b = _agg(run_a), _agg(run_b)
    m = pd.merge(a, b, on=KEY, how="outer", suffixes=("_a", "_b"), sort=False)
    m["label"] = m["label_a"].fillna(m["label_b"]) if len(m) else m.get("label_a")
    for col in ("status_a", "status_b"):
        m[col] = pd.Series(
            [x if isinstance(x, str) else None for x in m[col]], index=m.index, dtype=object
        )
    m["status_changed"] = [sa != sb for sa, sb in zip(m["status_a"], m["status_b"])]
    for f in FIGURES:
        va, vb = m[f"{f}_a"].astype(float), m[f"{f}_b"].astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            m[f"{f}_ratio"] = np.where((va > 0) & np.isfinite(vb), vb / va, np.nan)
        # None where no test could be made (a figure or its spread missing on a side)
        sig: list[bool | None] = []
        meth: list[str | None] = []
        better: list[bool | None] = []
        for i in range(len(m)):
            r = m.iloc[i]
            s, how = None, None
            if math.isfinite(r[f"{f}_a"]) and math.isfinite(r[f"{f}_b"]):
                la, ha, lb, hb = (r[f"{f}_lo_a"], r[f"{f}_hi_a"], r[f"{f}_lo_b"], r[f"{f}_hi_b"])
                if all(math.isfinite(x) for x in (la, ha, lb, hb)):
                    s, how = bool(hb < la or lb > ha), "ci"
                elif f == "total_tok_s" and r["phase"] == "decode":
                    ba = _bins(run_a, r["ids_a"])
                    bb = _bins(run_b, r["ids_b"])
                    if len(ba) >= 2 and len(bb) >= 2:
                        s, how = welch(ba, bb)[2], "welch"
            sig.append(s)
            meth.append(how)
            if s:
                up = r[f"{f}_b"] > r[f"{f}_a"]
                better.append(bool(up == HIGHER_IS_BETTER[f]))
            else:
                better.append(None)
        m[f"{f}_significant"] = pd.array(sig, dtype="boolean")
        m[f"{f}_method"] = meth
        m[f"{f}_better"] = pd.array(better, dtype="boolean")
    order = {"prefill": 0, "decode": 1}
    m = m.assign(_o=m["phase"].map(order)).sort_values(["_o", "context", "concurrency"])
    cols = KEY + ["label", "status_a", "status_b", "status_changed"]
    for f in FIGURES:
        cols += [
            f"{f}_a",
            f"{f}_lo_a",
            f"{f}_hi_a",
            f"{f}_b",
            f"{f}_lo_b",
            f"{f}_hi_b",
            f"{f}_ratio",
            f"{f}_significant",
            f"{f}_method",
            f"{f}_better",
        ]
    return m[cols].reset_index(drop=True)


def _mark(better) -> str:
    if better is True:
        return " ▲"
    if better is False:
        return " ▼"
    return ""


def _is(v) -> bool | None:
    return None if v is pd.NA or v is None else bool(v)


def build(run_a: Run, run_b: Run, la: str, lb: str) -> tuple[Report, pd.DataFrame]:
    df = compare(run_a, run_b)
    title = "Speed test matrix comparison"
    subtitle = f"{lb} versus {la}"
    engine_line = (
        f"A: {la} — {model_name(run_a.meta)} on {hardware_name(run_a.meta)} · "
        f"B: {lb} — {model_name(run_b.meta)} on {hardware_name(run_b.meta)}"
    )
    note = (
        "Ratios are B / A. ▲ marks a difference beyond the 95% confidence intervals that is "
        "an improvement in B, ▼ one that is a regression (lower TTFT and time between "
        "tokens are better); unmarked differences are within the noise."
    )
    sections = [
        Section(
            "Runs",
            table=Table(["", f"A: {la}", f"B: {lb}"], _meta_rows(run_a, run_b)),
            anchor="runs",
        ),
        _decode_section(df, note),
        _prefill_section(df),
        _status_section(df, la, lb),
        _all_section(df),
    ]
    return Report(title, subtitle, engine_line, "", [], sections), df


def _meta_rows(run_a: Run, run_b: Run) -> list[list[str]]:
    """The two runs' model, hardware, engine and settings side by side."""
    rows = []
    for name, path in (
        ("Model", None),
        ("Hardware", None),
        ("Engine", ("engine", "name")),
        ("Version", ("engine", "version")),
        ("Quantization", ("engine", "quantization")),
        ("Commit", ("engine", "commit")),
        ("Time per measurement", ("run", "duration_s")),
        ("Max output", ("run", "max_output")),
    ):
        vals = []
        for r in (run_a, run_b):
            v: Any = None
            if name == "Model":
                v = model_name(r.meta)
            elif name == "Hardware":
                v = hardware_name(r.meta)
            elif path is not None:
                v = (r.meta.get(path[0]) or {}).get(path[1])
                if name == "Time per measurement":
                    v = fmt.plain_seconds(v)
                elif name == "Max output":
                    v = fmt.tokens(v)
            vals.append(fmt.DASH if fmt.missing(v) else str(v))
        rows.append([name, vals[0], vals[1]])
    return rows


def _decode_section(df: pd.DataFrame, note: str) -> Section:
    """The grid of total tok/s ratios, B / A, each cell marked when beyond the noise."""
    dec = df[df["phase"] == "decode"]
    ctxs = sorted(dec["context"].unique().tolist())
    concs = sorted(dec["concurrency"].unique().tolist())
    rows, classes = [], []
    for c in ctxs:
        sub = dec[dec["context"] == c]
        # a cell is a str or a list of str (stacked lines), as in Table.rows
        row: list[str | list[str]] = [
            fmt.context_label(c) if sub.empty else str(sub["label"].iloc[0])
        ]
        cls = ["ctx"]
        for n in concs:
            r = sub[sub["concurrency"] == n]
            if r.empty:
                row.append([fmt.DASH])
                cls.append("missing")
                continue
            r = r.iloc[0]
            sa, sb = r["status_a"], r["status_b"]
            if sa == "over_capacity" and sb == "over_capacity":
                row.append(["Over capacity"])
                cls.append("over")
                continue
            lines = [
                f"{fmt.ratio(r['total_tok_s_ratio'])}{_mark(_is(r['total_tok_s_better']))}",
                f"{fmt.tok_s(r['total_tok_s_a'])} → {fmt.tok_s(r['total_tok_s_b'])}",
            ]
            if sa != sb:
                lines.append(f"{fmt.status_text(sa)} → {fmt.status_text(sb)}")
            row.append(lines)
            b = _is(r["total_tok_s_better"])
            cls.append("better" if b is True else "worse" if b is False else "valid")
        rows.append(row)
        classes.append(cls)
    return Section(
        "Sustained decode",
        table=Table(
            ["Context"] + [str(n) for n in concs],
            rows,
            classes=classes,
            caption="total tok/s, B / A · rows are context length, columns are "
            "simultaneous requests",
            note=note,
        ),
        text=[] if rows else ["Neither run has decode cells."],
        anchor="sustained-decode",
        charts=["ratio_heatmap", "total_overlay"],
    )


def _prefill_section(df: pd.DataFrame) -> Section:
    pre = df[df["phase"] == "prefill"]
    prow = [
        [
            f"{r['label']} context",
            fmt.tok_s_short(r["prompt_tok_s_a"]),
            fmt.tok_s_short(r["prompt_tok_s_b"]),
            fmt.ratio(r["prompt_tok_s_ratio"]) + _mark(_is(r["prompt_tok_s_better"])),
            fmt.ms(r["ttft_ms_a"]),
            fmt.ms(r["ttft_ms_b"]),
            fmt.ratio(r["ttft_ms_ratio"]),
        ]
        for _, r in pre.iterrows()
    ]
    return Section(
        "Prefill",
        table=Table(
            [
                "Context",
                "A prompt tok/s",
                "B prompt tok/s",
                "B / A",
                "A TTFT",
                "B TTFT",
                "B / A",
            ],
            prow,
            caption="prompt tok/s by context length",
        ),
        text=[] if prow else ["Neither run has prefill cells."],
        anchor="prefill",
    )


def _status_section(df: pd.DataFrame, la: str, lb: str) -> Section:
    ch = df[df["status_changed"]]
    crow = [
        [
            fmt.phase_text(r["phase"]),
            str(r["label"]),
            fmt.count(r["concurrency"]),
            fmt.status_text(r["status_a"]),
            fmt.status_text(r["status_b"]),
        ]
        for _, r in ch.iterrows()
    ]
    return Section(
        "Status changes",
        table=Table(["Phase", "Context", "Requests at once", f"A: {la}", f"B: {lb}"], crow),
        text=[] if crow else ["No cell changed status."],
        anchor="status-changes",
    )


def _all_section(df: pd.DataFrame) -> Section:
    """Every figure of every cell, A → B, with its ratio and significance."""
    arow = []
    for _, r in df.iterrows():
        if r["status_a"] == "over_capacity" and r["status_b"] == "over_capacity":
            continue
        line: list[str | list[str]] = [
            fmt.phase_text(r["phase"]),
            str(r["label"]),
            fmt.count(r["concurrency"]),
        ]
        figs = (
            ("prompt_tok_s", "ttft_ms")
            if r["phase"] == "prefill"
            else ("total_tok_s", "per_request_tok_s", "ttft_ms", "tbt_ms")
        )
        parts = []
        for f in figs:
            f1 = {"ttft_ms": fmt.ms, "tbt_ms": fmt.ms1}.get(f, fmt.tok_s)
            name = {
                "total_tok_s": "total",
                "per_request_tok_s": "per request",
                "ttft_ms": "TTFT",
                "tbt_ms": "TBT",
                "prompt_tok_s": "prompt",
            }[f]
            sig = _is(r[f"{f}_significant"])
            parts.append(
                f"{name} {f1(r[f'{f}_a'])} → {f1(r[f'{f}_b'])} "
                f"({fmt.ratio(r[f'{f}_ratio'])}{_mark(_is(r[f'{f}_better']))}"
                f"{'' if sig is None else (', beyond CI' if sig else ', within CI')})"
            )
        line.append(parts)
        arow.append(line)
    return Section(
        "All measurements",
        table=Table(
            ["Phase", "Context", "Requests at once", "Figures (A → B)"],
            arow,
            caption="Latencies are medians. Significance from non-overlapping 95% confidence "
            "intervals, else a Welch test over per-second throughput bins.",
        ),
        anchor="all-measurements",
    )


def ratio_heatmap(
    run_a: Run, run_b: Run, figure: str = "total_tok_s", df: pd.DataFrame | None = None
):
    """Heatmap of b/a of a decode figure (green = B better), ratios annotated.

    ``df`` is a :func:`compare` result to reuse (computed when not given).
    """

    df = compare(run_a, run_b) if df is None else df
    dec = df[df["phase"] == "decode"]
    ctxs = sorted(dec["context"].unique().tolist())
    concs = sorted(dec["concurrency"].unique().tolist())
    fig = Figure(
        figsize=(max(5.0, 0.9 * len(concs) + 2), max(2.8, 0.55 * len(ctxs) + 1.6)),
        layout="constrained",
    )
    ax = fig.add_subplot()
    if not ctxs:
        ax.text(0.5, 0.5, "no decode cells", ha="center", va="center", transform=ax.transAxes)
        return fig
    grid = np.full((len(ctxs), len(concs)), np.nan)
    for i, c in enumerate(ctxs):
        for j, n in enumerate(concs):
            r = dec[(dec["context"] == c) & (dec["concurrency"] == n)]
            if len(r):
                grid[i, j] = r[f"{figure}_ratio"].iloc[0]
    lg = np.log2(grid)
    lim = float(np.nanmax(np.abs(lg))) if np.isfinite(lg).any() else 1.0
    lim = max(lim, 0.05)
    cmap = matplotlib.colormaps["RdYlGn" if HIGHER_IS_BETTER[figure] else "RdYlGn_r"]
    cmap = cmap.with_extremes(bad="0.88")
    im = ax.imshow(np.ma.masked_invalid(lg), cmap=cmap, vmin=-lim, vmax=lim, aspect="auto")
    for i in range(len(ctxs)):
        for j in range(len(concs)):
            v = grid[i, j]
            ax.text(
                j,
                i,
                fmt.ratio(v) if np.isfinite(v) else "—",
                ha="center",
                va="center",
                fontsize=7.5,
            )
    ax.set_xticks(range(len(concs)), [str(n) for n in concs])
    ax.set_yticks(range(len(ctxs)), [fmt.context_label(c) for c in ctxs])
    ax.set_xlabel("simultaneous requests")
    ax.set_ylabel("context length")
    ax.set_title(f"{figure}: B / A")
    cb = fig.colorbar(im, ax=ax, shrink=0.8)
    cb.set_label("log2(B / A)")
    return fig


def total_overlay(run_a: Run, run_b: Run, la: str = "A", lb: str = "B"):
    """Total tok/s versus concurrency for both runs (solid A, dashed B), one colour per context."""

    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ma, mb = run_a.table("total_tok_s"), run_b.table("total_tok_s")
    labels = list(dict.fromkeys(list(ma.index) + list(mb.index)))
    colors = matplotlib.colormaps["viridis"](np.linspace(0, 0.9, max(1, len(labels))))
    xs: set[float] = set()
    for k, lab in enumerate(labels):
        for mat, ls in ((ma, "-"), (mb, "--")):
            if lab in mat.index:
                y = mat.loc[lab].to_numpy(float)
                x = np.array([float(c) for c in mat.columns])
                ok = np.isfinite(y)
                if ok.any():
                    xs.update(x[ok].tolist())
                    ax.plot(x[ok], y[ok], ls=ls, marker="o", ms=3, color=colors[k])
    if xs:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted(xs)
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        handles = [
            Line2D([], [], color=colors[k], marker="o", ms=3, label=str(lab))
            for k, lab in enumerate(labels)
        ]
        short = lambda s: s if len(s) <= 28 else s[:27] + "…"
        handles += [
            Line2D([], [], color="0.3", ls="-", label=f"A: {short(la)}"),
            Line2D([], [], color="0.3", ls="--", label=f"B: {short(lb)}"),
        ]
        ax.legend(handles=handles, fontsize=7, ncols=2, title="context / run")
    else:
        ax.text(
            0.5, 0.5, "no measured decode cells", ha="center", va="center", transform=ax.transAxes
        )
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("simultaneous requests")
    ax.set_ylabel("total tok/s")
    ax.set_title("Total throughput: A solid, B dashed")
    return fig


def write_compare(
    dir_a: str | os.PathLike,
    dir_b: str | os.PathLike,
    out_dir: str | os.PathLike,
    labels: tuple[str, str] | None = None,
    charts: bool = True,
) -> tuple[Path, Path]:
    """Write ``out_dir/compare.md`` and a self-contained ``out_dir/compare.html``."""

    ra, rb = load(dir_a), load(dir_b)
    la, lb = labels or (ra.label, rb.label)
    if la == lb:
        la, lb = f"{Path(dir_a).name}", f"{Path(dir_b).name}"
        if la == lb:
            la, lb = f"A ({la})", f"B ({lb})"
    rep, df = build(ra, rb, la, lb)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    svgs: dict[str, str] = {}
    if charts:
        for name, fig in (
            ("ratio_heatmap", ratio_heatmap(ra, rb, df=df)),
            ("total_overlay", total_overlay(ra, rb, la, lb)),
        ):
            svgs[name] = figure_to_svg(fig, id_prefix=name)
            plt.close(fig)
            atomic_write(out / "plots" / f"{name}.svg", svgs[name].encode("utf-8"))
    md = md_mod.render(rep, {n: f"plots/{n}.svg" for n in svgs})
    page = html_mod.render(rep, svgs, generator="Generated by speedmatrix compare.")
    md_path, html_path = out / "compare.md", out / "compare.html"
    atomic_write(md_path, md.encode("utf-8"))
    atomic_write(html_path, page.encode("utf-8"))
    df.to_csv(out / "compare.csv", index=False)
    return md_path, html_path
