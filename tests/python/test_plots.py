"""Charts: each function returns a Figure with the right content, and embeds as inline SVG."""

import json
import re

import matplotlib
import numpy as np
import pytest
import synthetic
from matplotlib.figure import Figure
from speedmatrix.report import plots
from speedmatrix.results import load
from speedmatrix.runfile import write_run


@pytest.fixture(scope="module")
def run():
    return load(synthetic.shared_run("full"))


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_backend_is_agg():
    assert matplotlib.get_backend().lower() == "agg"


def test_heatmap_annotates_and_marks_over_capacity(run):
    fig = plots.decode_heatmap(run)
    assert isinstance(fig, Figure)
    texts = _texts(fig)
    n_over = int((run.cells["status"] == "over_capacity").sum())
    assert texts.count("Over\ncapacity") == n_over
    assert any(t.endswith("queued") for t in texts)
    # the failed cell reads "Error" as in the report's matrix (no figure), hatched red
    n_err = int((run.cells["status"] == "error").sum())
    assert n_err and texts.count("Error") == n_err
    ax = fig.axes[0]
    assert len([p for p in ax.patches if p.get_hatch() == "xx"]) == n_err
    hatched = [p for p in ax.patches if p.get_hatch() == "//"]
    assert len(hatched) == n_over
    assert [t.get_text() for t in ax.get_yticklabels()] == ["8K", "16K", "32K", "64K", "123K"]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "1",
        "2",
        "4",
        "8",
        "16",
        "32",
        "64",
        "128",
    ]
    v = run.table("total_tok_s").loc["8K", 1]
    assert f"{v:,.1f}" in texts


def test_lines_vs_concurrency(run):
    for fn, fig_name in (
        (plots.total_vs_concurrency, "total_tok_s"),
        (plots.per_request_vs_concurrency, "per_request_tok_s"),
    ):
        fig = fn(run)
        ax = fig.axes[0]
        assert ax.get_xscale() == "log"
        assert ax.xaxis.get_transform().base == 2
        lines = [
            ln for ln in ax.get_lines() if ln.get_label() in ("8K", "16K", "32K", "64K", "123K")
        ]
        assert len(lines) == 5
        m = run.table(fig_name)
        y = lines[0].get_ydata()
        assert np.allclose(y, m.loc["8K"].dropna().to_numpy(float))


def test_ttft_and_prefill_vs_context(run):
    fig = plots.ttft_vs_context(run)
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert "prefill (cold)" in labels and "1 at once" in labels
    fig = plots.prefill_vs_context(run)
    ax = fig.axes[0]
    pre = run.prefill()
    assert np.allclose(ax.get_lines()[0].get_ydata(), pre["prompt_tok_s"])
    assert "10.5K" in _texts(fig) or "10.4K" in _texts(fig)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    # too close to print apart: 123K's tick names both, 128K's own is blank
    assert "123K/128K" in ticks and "128K" not in ticks


def test_tbt_distribution_from_records(run):
    cid = "decode-c8192-n8-r0"
    fig = plots.tbt_distribution(run, cid)
    ax = fig.axes[0]
    counts = sum(p.get_height() for p in ax.patches)
    assert counts == len(run.tbt_samples(cid))
    med = [ln for ln in ax.get_lines() if ln.get_label().startswith("p50")]
    c = run.cells.set_index("id").loc[cid]
    assert med and med[0].get_xdata()[0] == pytest.approx(c["tbt_ms"])
    missing = plots.tbt_distribution(run, "decode-c8192-n128-r0")  # over capacity: no records
    assert any("no token records" in t for t in _texts(missing))
    assert plots.throughput_over_time(run, cid).axes[0].patches  # the steps of the bins


def test_figure_to_svg_is_inline_svg(run):
    svg = plots.figure_to_svg(plots.decode_heatmap(run))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "<?xml" not in svg and "<!DOCTYPE" not in svg and "<metadata>" not in svg
    assert "Over" in svg  # text stays text (svg.fonttype none)
    ns = plots.figure_to_svg(plots.total_vs_concurrency(run), id_prefix="total")
    ids = re.findall(r'\bid="([^"]+)"', ns)
    assert ids and all(i.startswith("total-") for i in ids)
    refs = re.findall(r"url\(#([^)]+)\)", ns)
    assert refs and set(refs) <= set(ids)


def test_plots_on_interrupted_and_empty_runs(tmp_path):
    r = load(synthetic.shared_run("interrupted"))
    figs = plots.all_figures(r)
    assert {"decode_heatmap", "total_vs_concurrency", "prefill_vs_context"} <= set(figs)
    assert "not run" in _texts(figs["decode_heatmap"])
    write_run(tmp_path, {"schema": "speedmatrix.run/1", "meta": {}, "cells": []})
    empty = load(tmp_path)
    for name, fig in plots.all_figures(empty).items():
        assert isinstance(fig, Figure), name
        assert plots.figure_to_svg(fig).startswith("<svg")


def test_plots_with_only_failed_cells(tmp_path):
    doc = json.loads((synthetic.shared_run("norecords") / "run.json").read_text())
    for c in doc["cells"]:
        if c["phase"] == "decode" and c["status"] != "over_capacity":
            c.update(
                status="error",
                total_tok_s=None,
                per_request_tok_s=None,
                ttft_ms=None,
                tbt_ms=None,
                errors={"connect": 4},
            )
    write_run(tmp_path, doc)
    r = load(tmp_path)
    fig = plots.decode_heatmap(r)
    assert "Error" in _texts(fig)
    assert any("no measured decode" in t for t in _texts(plots.total_vs_concurrency(r)))


def test_throughput_over_time_draws_the_whole_window_with_its_last_bin(tmp_path):
    # a 3 s window is three 1 s bins, drawn 0-3 s: the last one a step as wide as the
    # others, not a spike at 2 s
    synthetic.build_run(
        tmp_path, contexts=(8192,), concurrency=(4,), prefill_contexts=(), duration_s=3.0
    )
    run = load(tmp_path)
    cid = plots.representative_cell(run)
    measured_s = float(run.cell(cid)["measured_s"])
    b = run.bins(cid)
    assert b.size == 3 and 2.9 < measured_s < 3.1
    ax = plots.throughput_over_time(run, cid).axes[0]
    assert ax.dataLim.x0 == 0 and ax.dataLim.x1 == pytest.approx(measured_s)
    assert ax.get_xlim()[1] == pytest.approx(measured_s)
    (steps,) = ax.patches
    values, edges, _ = steps.get_data()
    assert list(values) == list(b)
    widths = np.diff(edges)
    assert widths[-1] >= 0.9 and widths[-1] == pytest.approx(measured_s - 2)


def test_a_window_that_ends_inside_a_bin_widens_the_last_step(tmp_path):
    synthetic.build_run(
        tmp_path, contexts=(8192,), concurrency=(2,), prefill_contexts=(), duration_s=2.5
    )
    run = load(tmp_path)
    cid = plots.representative_cell(run)
    measured_s = float(run.cell(cid)["measured_s"])
    b = run.bins(cid)
    _, edges, _ = plots.throughput_over_time(run, cid).axes[0].patches[0].get_data()
    assert len(edges) == b.size + 1 and edges[-1] == pytest.approx(measured_s)
    # the widened last bin's rate is over its whole width: no spike, no dip
    assert b[-1] == pytest.approx(float(np.median(b)), rel=0.25)


def _long_named(tmp_path):
    d = synthetic.shared_run("full")
    doc = json.loads((d / "run.json").read_text())
    doc["meta"]["target"]["model_name"] = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
    doc["meta"]["engine"]["simulated"] = True
    doc["meta"]["hardware"]["gpu"] = "NVIDIA H200 NVL"
    import shutil

    shutil.copytree(d / "records", tmp_path / "records")
    write_run(tmp_path, doc)
    return load(tmp_path)


def test_every_chart_title_lies_inside_its_figure(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    run = _long_named(tmp_path)
    line = plots.run_line(run)
    assert "0.5.6.post3.dev9265" in line and line.endswith("8 s window")
    figs = plots.all_figures(run)
    assert len(figs) == 7
    for name, fig in figs.items():
        FigureCanvasAgg(fig)
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        (ax,) = [a for a in fig.axes if a.get_title(loc="left")]
        title = ax._left_title
        box = title.get_window_extent(r)
        fb = fig.bbox
        assert fb.x0 <= box.x0 and box.x1 <= fb.x1 and fb.y0 <= box.y0 and box.y1 <= fb.y1, (
            name,
            box,
            fb,
        )
        assert box.y0 >= ax.bbox.y1 - 1, name  # above the axes, not over the data
        text = title.get_text()
        assert "0.5.6.post3.dev9265" in text and text.endswith("8 s window"), name


def test_a_dollar_in_a_model_id_is_drawn_literally_not_as_mathtext(tmp_path):
    d = synthetic.shared_run("full")
    doc = json.loads((d / "run.json").read_text())
    doc["meta"]["target"]["model_name"] = "m $x^2$ y\n## two"
    write_run(tmp_path, doc)
    title = plots.ttft_vs_context(load(tmp_path)).axes[0].get_title(loc="left")
    assert r"m \$x^2\$ y ## two" in title
