"""The report as data, independent of the output format: sections of items, a table and
paragraphs, which `markdown` and `html` render (so the two cannot disagree)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


def chart_section(
    title: str, anchor: str, chart: str, columns: list[str], rows: list[list[Any]], text: str
) -> Section | None:
    """A section of one table (a row per cell), a paragraph and one chart: the shape of the
    per-feature views (traffic shapes, prefix cache, reasoning); None when there is no row."""
    if not rows:
        return None
    return Section(title, table=Table(columns, rows), text=[text], anchor=anchor, charts=[chart])
