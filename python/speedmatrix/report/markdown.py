"""The report as Markdown (GitHub-flavoured: tables, ``<br>`` for stacked lines)."""

from __future__ import annotations

from speedmatrix.report.tables import Report, Section, Table

CHART_TITLES = {
    "decode_heatmap": "Sustained decode throughput by context and concurrency",
    "total_vs_concurrency": "Total tok/s versus simultaneous requests",
    "per_request_vs_concurrency": "Per request tok/s versus simultaneous requests",
    "ttft_vs_context": "TTFT versus context",
    "prefill_vs_context": "Prefill prompt tok/s versus context",
    "tbt_distribution": "Time between tokens of one cell",
    "throughput_over_time": "Throughput across one cell's window",
    "ratio_heatmap": "Total tok/s, B / A, by context and concurrency",
    "total_overlay": "Total tok/s versus simultaneous requests, both runs",
    "capacity_vs_load": "SLO attainment versus load per context, with the capacity estimate",
}


def _cell(v) -> str:
    if isinstance(v, (list, tuple)):
        return "<br>".join(_esc(x) for x in v)
    return _esc(v)


def _esc(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def table_md(t: Table) -> list[str]:
    out = []
    if t.caption:
        out += [t.caption, ""]
    out.append("| " + " | ".join(_esc(c) for c in t.columns) + " |")
    out.append("|" + "|".join("---" for _ in t.columns) + "|")
    for row in t.rows:
        out.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if t.note:
        out += ["", t.note]
    return out


def section_md(s: Section, chart_files: dict[str, str]) -> list[str]:
    out = [f"## {s.title}", ""]
    if s.items is not None:
        out += [f"- **{k}:** {_esc(v)}" for k, v in s.items]
        out.append("")
    if s.code is not None:
        fence = "```"
        while fence in s.code:
            fence += "`"
        out += [fence + "sh", s.code, fence, ""]
    if s.table is not None and s.table.rows:
        out += table_md(s.table) + [""]
    for p in s.text:
        out += [p, ""]
    for name in s.charts:
        if name in chart_files:
            out += [f"![{CHART_TITLES.get(name, name)}]({chart_files[name]})", ""]
    return out


def render(report: Report, chart_files: dict[str, str] | None = None) -> str:
    """Markdown text of ``report``; ``chart_files`` maps chart names to relative image paths."""
    chart_files = chart_files or {}
    out = [f"# {report.title}", "", f"**{report.subtitle}**", "", report.engine_line, ""]
    if report.matrix_line:
        out += [report.matrix_line, ""]
    for n in report.notes:
        out += [f"> **Note:** {n}", ""]
    for s in report.sections:
        if s.title == "Charts" and not any(c in chart_files for c in s.charts):
            continue
        out += section_md(s, chart_files)
    return "\n".join(out).rstrip() + "\n"
