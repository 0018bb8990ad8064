"""The report's prefix-cache view on synthetic cells: shown only when cells carry the axis,
requested against delivered, the mismatch flag named, and a chart with a line per cell group."""

from __future__ import annotations

import pandas as pd
from speedmatrix.report.prefixcache import (
    cache_cells,
    prefix_cache_section,
    ttft_by_cached_fraction,
)


def _cells() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "context": 1024,
                "concurrency": 1,
                "cached_fraction": 0.9,
                "delivered_cached_fraction": 0.7,
                "ttft_ms": 60.0,
                "flags": ["cache_hit_mismatch"],
            },
            {
                "context": 1024,
                "concurrency": 1,
                "cached_fraction": 0.0,
                "delivered_cached_fraction": 0.0,
                "ttft_ms": 300.0,
                "flags": [],
            },
            {
                "context": 1024,
                "concurrency": 1,
                "cached_fraction": 0.5,
                "delivered_cached_fraction": 0.5,
                "ttft_ms": 150.0,
                "flags": [],
            },
        ]
    )


def test_a_run_without_the_axis_has_no_section() -> None:
    plain = pd.DataFrame([{"context": 1024, "concurrency": 1, "ttft_ms": 10.0, "flags": []}])
    assert prefix_cache_section(plain) is None
    assert cache_cells(plain).empty


def test_the_section_lists_asked_against_delivered_in_order() -> None:
    section = prefix_cache_section(_cells())
    assert section is not None and section.table is not None
    rows = section.table.rows
    assert [r[2] for r in rows] == ["0.0%", "50.0%", "90.0%"]
    assert [r[3] for r in rows] == ["0.0%", "50.0%", "70.0%"]
    assert [r[5] for r in rows] == ["", "", "cache hit mismatch"]
    assert section.charts == ["ttft_vs_cached_fraction"]


def test_the_chart_plots_ttft_against_the_delivered_fraction() -> None:
    fig = ttft_by_cached_fraction(_cells())
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [0.0, 50.0, 70.0]
    assert list(line.get_ydata()) == [300.0, 150.0, 60.0]
