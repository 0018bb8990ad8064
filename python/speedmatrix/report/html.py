"""The report as one self-contained HTML file: inline CSS, charts as inline SVG, no script.

The page is rendered from Jinja2 templates (``templates/page.html.j2`` and
``templates/table.html.j2``, CSS in ``templates/report.css``) with autoescape on: this
module only turns a :class:`model.Report` into plain views (rows of cells with their CSS
class, heat colour and stacked lines); every word on the page comes from the sections.
"""

from __future__ import annotations

import math
import re
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import jinja2

from speedmatrix.report.formatting import FLAG_MARK
from speedmatrix.report.goodput import BELOW_MARK
from speedmatrix.report.markdown import CHART_TITLES
from speedmatrix.report.model import Report, Section, Table

TEMPLATES = Path(__file__).resolve().parent / "templates"
CSS = (TEMPLATES / "report.css").read_text(encoding="utf-8")


@cache
def _env():
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
    )


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


def table_view(t: Table, css: str = "") -> SimpleNamespace:
    """The template's view of a table: each cell's tag, class, heat style and content."""
    matrix = css == "matrix"
    nums = []
    if matrix:
        for row in t.rows:
            for v in row[1:]:
                if isinstance(v, list) and v and math.isfinite(_num(v[0])):
                    nums.append(_num(v[0]))
    lo, hi = (min(nums), max(nums)) if nums else (math.nan, math.nan)
    rows = []
    for i, row in enumerate(t.rows):
        cls = t.classes[i] if i < len(t.classes) else []
        cells = []
        for j, v in enumerate(row):
            c = cls[j] if j < len(cls) else ""
            cell = SimpleNamespace(
                tag="th" if matrix and j == 0 else "td",
                cls=c,
                style="",
                spans=None,
                lines=None,
                text="",
            )
            if matrix and isinstance(v, list):
                cell.spans = [(_kind(k, line), str(line)) for k, line in enumerate(v)]
                if c.split(" ")[0] in ("valid", "queued"):
                    cell.style = _heat(_num(v[0]), lo, hi)
            elif isinstance(v, list):
                cell.lines = [str(x) for x in v]
            else:
                cell.text = str(v)
                if not c:
                    cell.cls = (
                        "wrap"
                        if len(cell.text) > 40
                        else ("" if _NUMERIC.match(cell.text) else "txt")
                    )
            cells.append(cell)
        rows.append(cells)
    return SimpleNamespace(
        caption=t.caption, css=css, columns=[str(c) for c in t.columns], rows=rows, note=t.note
    )


def _kind(k: int, line: str) -> str:
    """The span class of a stacked matrix line: the figure, queued, a flag, or a detail."""
    if k == 0:
        return "v"
    if line == "Requests queued":
        return "q"
    if str(line).startswith(BELOW_MARK):
        return "b"
    return "f" if str(line).startswith(FLAG_MARK) else "t"


def table_html(t: Table, css: str = "") -> str:
    """One table as HTML (the same macro the page uses)."""
    macro = _env().get_template("table.html.j2").module.table
    return str(macro(table_view(t, css)))


_NUMERIC = re.compile(r"^[-+—]?[\d.,]*\d?[\d.,–\-]*(K|×|%| ms| s| GB| tokens)?$|^—$")


def section_view(s: Section, charts: dict[str, str]) -> SimpleNamespace:
    css = s.css or {"Sustained decode": "matrix", "Prefill": "prefill"}.get(s.title, "data")
    return SimpleNamespace(
        title=s.title,
        anchor=s.anchor or _slug(s.title),
        items=s.items,
        code=s.code,
        table=table_view(s.table, css) if s.table is not None and s.table.rows else None,
        text=list(s.text),
        charts=[
            SimpleNamespace(name=name, svg=charts[name], title=CHART_TITLES.get(name, name))
            for name in s.charts
            if name in charts
        ],
    )


def render(report: Report, charts: dict[str, str] | None = None, generator: str = "") -> str:
    """HTML text of ``report``; ``charts`` maps chart names to inline ``<svg>`` strings."""
    charts = charts or {}
    sections = [
        section_view(s, charts)
        for s in report.sections
        if not (s.title == "Charts" and not any(c in charts for c in s.charts))
    ]
    page = (
        _env()
        .get_template("page.html.j2")
        .render(report=report, sections=sections, css=CSS, generator=generator)
    )
    return page.rstrip() + "\n"
