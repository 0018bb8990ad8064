"""The report as Markdown (GitHub-flavoured: tables, ``<br>`` for stacked lines).

Every string of the report passes through :func:`text` on its way into Markdown: model ids,
engine and GPU names, error messages and reasons come from a server or a user, and a
Markdown renderer with raw HTML on would run an ``<iframe srcdoc>`` in a model id, or take a
newline followed by ``## Summary`` for a section of invented figures (issue 25).
"""

from __future__ import annotations

import re
from typing import Any

from speedmatrix.report.model import Report, Section, Table

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

#: longest line (title, heading, item, table cell) and longest paragraph kept, in characters:
#: a server's 10,000 model names must not become a 10,000-name title
LINE_CHARS = 500
PARAGRAPH_CHARS = 6000
#: the longest launch command kept in its code block
CODE_CHARS = 20_000

_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")
# C0 controls and the bidirectional overrides that make text read other than it is stored
_INVISIBLE = re.compile(r"[\x00-\x08\x0e-\x1b\x7f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# punctuation that starts code, emphasis, links, headings, strikethrough or a table cell;
# "_" only at a word's edge (inside snake_case it is not emphasis and reads better bare)
_PUNCT = re.compile(r"[\\`*\[\]|#~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# a block that a line may start with: list item, setext underline, ordered item
_LINE_START = re.compile(r"^[-+=]")
_ORDERED = re.compile(r"^(\d+)([.)])(?=\s|$)")


def text(v: Any, limit: int = LINE_CHARS, starts_line: bool = False) -> str:
    """``v`` as Markdown that renders as exactly its text, on one line: line breaks folded to
    spaces, invisible controls dropped, cut to ``limit`` characters (with "…"), HTML's and
    Markdown's special characters escaped, and, for text that ``starts_line`` (a paragraph),
    a leading list or heading marker too. The one way a string enters the Markdown report."""
    s = _INVISIBLE.sub("", _BREAKS.sub(" ", str(v))).replace("\t", " ").strip()
    if len(s) > limit:
        s = s[: limit - 1].rstrip() + "…"
    s = "".join(_HTML.get(ch, ch) for ch in s)
    s = _PUNCT.sub(lambda m: "\\" + m.group(0), s)
    if not starts_line:  # inside a table cell, an item or a heading: no block starts here
        return s
    return _ORDERED.sub(r"\1\\\2", _LINE_START.sub(lambda m: "\\" + m.group(0), s))


def _cell(v) -> str:
    if isinstance(v, (list, tuple)):
        return "<br>".join(text(x) for x in v)
    return text(v)


def table_md(t: Table) -> list[str]:
    out = []
    if t.caption:
        out += [text(t.caption, PARAGRAPH_CHARS, starts_line=True), ""]
    out.append("| " + " | ".join(text(c) for c in t.columns) + " |")
    out.append("|" + "|".join("---" for _ in t.columns) + "|")
    for row in t.rows:
        out.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if t.note:
        out += ["", text(t.note, PARAGRAPH_CHARS, starts_line=True)]
    return out


def code_block(code: str, lang: str = "sh") -> list[str]:
    """``code`` verbatim in a fence longer than any run of backticks inside it (nothing in a
    fenced block is Markdown or HTML)."""
    code = _INVISIBLE.sub("", code)[:CODE_CHARS]
    fence = "```"
    while fence in code:
        fence += "`"
    return [fence + lang, code, fence]


def section_md(s: Section, chart_files: dict[str, str]) -> list[str]:
    out = [f"## {text(s.title)}", ""]
    if s.items is not None:
        out += [f"- **{text(k)}:** {text(v)}" for k, v in s.items]
        out.append("")
    if s.code is not None:
        out += code_block(s.code) + [""]
    if s.table is not None and s.table.rows:
        out += table_md(s.table) + [""]
    for p in s.text:
        out += [text(p, PARAGRAPH_CHARS, starts_line=True), ""]
    for name in s.charts:
        if name in chart_files:
            out += [f"![{text(CHART_TITLES.get(name, name))}]({chart_files[name]})", ""]
    return out


def render(report: Report, chart_files: dict[str, str] | None = None) -> str:
    """Markdown text of ``report``; ``chart_files`` maps chart names to relative image paths."""
    chart_files = chart_files or {}
    out = [f"# {text(report.title)}", "", f"**{text(report.subtitle)}**", ""]
    out += [text(report.engine_line, starts_line=True), ""]
    if report.matrix_line:
        out += [text(report.matrix_line, starts_line=True), ""]
    for n in report.notes:
        out += [f"> **Note:** {text(n, PARAGRAPH_CHARS)}", ""]
    for s in report.sections:
        if s.title == "Charts" and not any(c in chart_files for c in s.charts):
            continue
        out += section_md(s, chart_files)
    return "\n".join(out).rstrip() + "\n"
