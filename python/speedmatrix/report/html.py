"""The report as one self-contained HTML file: inline CSS, charts as inline SVG, no script."""

from __future__ import annotations

import html
import math
import re

from speedmatrix.report.formatting import FLAG_MARK
from speedmatrix.report.markdown import CHART_TITLES
from speedmatrix.report.tables import Report, Section, Table

CSS = """
:root { --fg:#1d2330; --muted:#5b6474; --line:#d9dee7; --bg:#ffffff; --soft:#f4f6f9;
        --queued:#e67e22; --error:#c0392b; --flag:#8e44ad; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 34px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
.subtitle { font-size: 18px; font-weight: 600; margin: 0 0 6px; }
.engine, .size { color: var(--muted); margin: 2px 0; }
.note { background: #fff6e5; border-left: 4px solid var(--queued); padding: 8px 12px; margin: 12px 0; }
nav { margin: 14px 0 0; font-size: 13px; }
nav a { color: var(--muted); margin-right: 12px; text-decoration: none; }
nav a:hover { text-decoration: underline; }
dl.items { display: grid; grid-template-columns: max-content 1fr; gap: 3px 18px; margin: 0; }
dl.items dt { color: var(--muted); }
dl.items dd { margin: 0; font-weight: 500; }
pre.cmd { background: var(--soft); border: 1px solid var(--line); padding: 10px 12px; white-space: pre-wrap;
          word-break: break-all; font: 12.5px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; }
.caption { color: var(--muted); margin: 0 0 6px; }
.legend { color: var(--muted); font-size: 12.5px; margin: 8px 0 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: right; vertical-align: top;
         white-space: nowrap; }
td.txt { text-align: left; }
td.wrap { white-space: normal; text-align: left; min-width: 240px; }
th { background: var(--soft); font-weight: 600; text-align: center; white-space: normal; }
td:first-child, th:first-child { text-align: left; }
table.matrix td { text-align: center; min-width: 86px; }
table.matrix td .v { display: block; font-weight: 600; font-size: 15px; }
table.matrix td .q { display: block; color: var(--queued); font-size: 11.5px; font-weight: 600; }
table.matrix td .t { display: block; color: var(--muted); font-size: 12px; }
table.matrix td .f { display: block; color: var(--flag); font-size: 11.5px; font-weight: 600; }
table.matrix td.flagged { box-shadow: inset 4px 0 0 var(--flag); }
section#summary dl.items dd { font-size: 15px; }
section#summary { background: var(--soft); border: 1px solid var(--line); border-radius: 6px;
                  padding: 4px 18px 14px; margin-top: 22px; }
section#summary h2 { margin-top: 12px; }
table.matrix td.over { background: repeating-linear-gradient(45deg, #eceef2, #eceef2 6px, #e1e4ea 6px, #e1e4ea 12px);
                       color: var(--muted); }
table.matrix td.error { color: var(--error); font-weight: 600; }
table.matrix td.queued { outline: 2px dashed var(--queued); outline-offset: -3px; }
table.matrix td.better { background: #dcf1d8; }
table.matrix td.worse { background: #f8dcd8; }
table.matrix td.missing { color: var(--muted); font-style: italic; }
table.prefill td.sub { color: var(--muted); }
td.status { text-align: left; }
figure { margin: 14px 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 12.5px; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
"""


def _e(v) -> str:
    return html.escape(str(v), quote=True)


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def _heat(v: float, lo: float, hi: float) -> str:
    """A light background colour for a matrix figure: pale blue (low) to pale green (high)."""
    if not (math.isfinite(v) and math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return ""
    x = (
        (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        if lo > 0
        else (v - lo) / (hi - lo)
    )
    x = min(max(x, 0.0), 1.0)
    a = (228, 238, 250)
    b = (199, 233, 192)
    c = tuple(round(a[i] + (b[i] - a[i]) * x) for i in range(3))
    return f"background:rgb{c}"


def _num(s: str) -> float:
    s = s.replace(",", "")
    try:
        return float(s[:-1]) * 1000 if s.endswith("K") else float(s)
    except ValueError:
        return math.nan


def table_html(t: Table, css: str = "") -> str:
    out = []
    if t.caption:
        out.append(f'<p class="caption">{_e(t.caption)}</p>')
    out.append('<div class="scroll">')
    out.append(
        f'<table class="{_e(css)}"><thead><tr>'
        + "".join(f"<th>{_e(c)}</th>" for c in t.columns)
        + "</tr></thead><tbody>"
    )
    matrix = css == "matrix"
    nums = []
    if matrix:
        for row in t.rows:
            for v in row[1:]:
                if isinstance(v, list) and v and math.isfinite(_num(v[0])):
                    nums.append(_num(v[0]))
    lo, hi = (min(nums), max(nums)) if nums else (math.nan, math.nan)
    for i, row in enumerate(t.rows):
        cls = t.classes[i] if i < len(t.classes) else []
        cells = []
        for j, v in enumerate(row):
            c = cls[j] if j < len(cls) else ""
            style = ""
            if matrix and isinstance(v, list):
                parts = []
                for k, line in enumerate(v):
                    kind = (
                        "v"
                        if k == 0
                        else (
                            "q"
                            if line == "Requests queued"
                            else ("f" if line.startswith(FLAG_MARK) else "t")
                        )
                    )
                    parts.append(f'<span class="{kind}">{_e(line)}</span>')
                inner = "".join(parts)
                if c.split(" ")[0] in ("valid", "queued"):
                    style = _heat(_num(v[0]), lo, hi)
            elif isinstance(v, list):
                inner = "<br>".join(_e(x) for x in v)
            else:
                inner = _e(v)
                if not c:
                    text = str(v)
                    c = "wrap" if len(text) > 40 else ("" if _NUMERIC.match(text) else "txt")
            tag = "th" if matrix and j == 0 else "td"
            attrs = (f' class="{_e(c)}"' if c else "") + (f' style="{style}"' if style else "")
            cells.append(f"<{tag}{attrs}>{inner}</{tag}>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    if t.note:
        out.append(f'<p class="legend">{_e(t.note)}</p>')
    return "\n".join(out)


_NUMERIC = re.compile(r"^[-+—]?[\d.,]*\d?[\d.,–\-]*(K|×|%| ms| s| GB| tokens)?$|^—$")


def _figure(name: str, svg: str) -> str:
    title = CHART_TITLES.get(name, name)
    return (
        f'<figure class="chart" id="chart-{_e(name)}">{svg}'
        f"<figcaption>{_e(title)}</figcaption></figure>"
    )


def section_html(s: Section, charts: dict[str, str]) -> str:
    anchor = s.anchor or _slug(s.title)
    out = [f'<section id="{_e(anchor)}"><h2>{_e(s.title)}</h2>']
    if s.items is not None:
        out.append(
            '<dl class="items">'
            + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in s.items)
            + "</dl>"
        )
    if s.code is not None:
        out.append(f'<pre class="cmd">{_e(s.code)}</pre>')
    if s.table is not None and s.table.rows:
        css = {"Sustained decode": "matrix", "Prefill": "prefill"}.get(s.title, "data")
        out.append(table_html(s.table, css))
    for p in s.text:
        out.append(f"<p>{_e(p)}</p>")
    for name in s.charts:
        if name in charts:
            out.append(_figure(name, charts[name]))
    out.append("</section>")
    return "\n".join(out)


def render(report: Report, charts: dict[str, str] | None = None, generator: str = "") -> str:
    """HTML text of ``report``; ``charts`` maps chart names to inline ``<svg>`` strings."""
    charts = charts or {}
    sections = [
        s
        for s in report.sections
        if not (s.title == "Charts" and not any(c in charts for c in s.charts))
    ]
    nav = "".join(
        f'<a href="#{_e(s.anchor or _slug(s.title))}">{_e(s.title)}</a>' for s in sections
    )
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(report.title)}: {_e(report.subtitle)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<header><h1>{_e(report.title)}</h1>",
        f'<p class="subtitle">{_e(report.subtitle)}</p>',
        f'<p class="engine">{_e(report.engine_line)}</p>',
    ]
    if report.matrix_line:
        head.append(f'<p class="size">{_e(report.matrix_line)}</p>')
    for n in report.notes:
        head.append(f'<p class="note">{_e(n)}</p>')
    head.append(f"<nav>{nav}</nav></header>")
    body = [section_html(s, charts) for s in sections]
    foot = [f"<footer>{_e(generator)}</footer>" if generator else "", "</main></body></html>"]
    return "\n".join(head + body + foot) + "\n"
