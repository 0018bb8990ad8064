"""The report leads with the answer (summary block), marks flagged cells in the grid and the
heatmap, says only what is true of the cells present (legends, error sentences), and names
the run in every chart's title."""

import copy
import json
import re
from pathlib import Path

import pytest
import synthetic
from speedmatrix.report import cells as report_cells
from speedmatrix.report import formatting as fmt
from speedmatrix.report import plots, render_report
from speedmatrix.report import summary as report_summary
from speedmatrix.report.markdown import text as md_text
from speedmatrix.results import load
from speedmatrix.runfile import read_run, write_run

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """2 contexts × 1, 2, 4, 8: no queued cell; 8K × 8 flagged long_ramp; 16K × 8 over
    capacity; returns the run.json document (records-free) for variants."""
    d = tmp_path_factory.mktemp("small")
    synthetic.build_run(
        d,
        contexts=(8192, 16384),
        concurrency=(1, 2, 4, 8),
        prefill_contexts=(8192,),
        with_records=False,
        errors=False,
    )
    doc = read_run(d)
    for c in doc["cells"]:
        c["flags"] = []
        if c["phase"] == "decode" and c["status"] == "queued":
            c["status"] = "valid"
            c.pop("reason", None)
        if c["phase"] == "decode" and (c["context"], c["concurrency"]) == (8192, 8):
            c["flags"] = ["long_ramp"]
        if c["phase"] == "decode" and (c["context"], c["concurrency"]) == (16384, 8):
            c.update(status="over_capacity", total_tok_s=None, per_request_tok_s=None)
    return doc


def _render(tmp_path, doc, charts=False):
    write_run(tmp_path, doc)
    md, page, svgs = render_report(load(tmp_path), charts=charts)
    return md, page, svgs


def _section(md, title):
    start = md.index(f"## {title}\n")
    nxt = md.find("\n## ", start + 3)
    return md[start : nxt if nxt > 0 else len(md)]


def test_summary_comes_first_and_answers(tmp_path, small):
    md, page, _ = _render(tmp_path, small)
    assert md.index("## Summary") < md.index("## Hardware")
    assert page.index("<h2>Summary</h2>") < page.index("<h2>Hardware</h2>")
    run = load(tmp_path)
    tot = run.table("total_tok_s")
    peak = float(tot.max().max())
    where = tot.stack().idxmax()
    s = _section(md, "Summary")
    assert f"**Peak throughput:** {fmt.tok_s(peak)} total tok/s at {where[0]} context × " in s
    assert f"{where[1]} requests at once" in s
    single = run.table("per_request_tok_s")[1]
    for label, v in single.items():
        assert f"{fmt.tok_s(v)} at {label}" in s
    assert "**Flagged cells:** 1 of" in s and "Long ramp (1)" in s
    # per context: 16K fits up to 4 and is over capacity at 8
    assert re.search(r"\| 16K \| [^|]+ \| [^|]+ \| [^|]+ \| 4 at once fit; 8 over capacity \|", s)
    assert re.search(r"\| 8K \| [^|]+ \| [^|]+ \| [^|]+ \| every level fits \|", s)


def test_knee_is_the_last_level_at_or_above_the_share(tmp_path, small):
    doc = copy.deepcopy(small)
    for c in doc["cells"]:
        if c["phase"] == "decode" and c["context"] == 8192:
            c["per_request_tok_s"] = {1: 100.0, 2: 80.0, 4: 49.0, 8: 60.0}[c["concurrency"]]
    write_run(tmp_path, doc)
    s = report_summary.summary(load(tmp_path))
    row = next(r for r in s["contexts"] if r["context"] == 8192)
    assert row["single_tok_s"] == 100.0
    assert row["knee"] == 2  # 4 falls below 50%; a later rebound does not extend the knee


def test_flagged_cell_is_marked_in_the_grid_with_a_legend(tmp_path, small):
    md, page, _ = _render(tmp_path, small)
    dec = _section(md, "Sustained decode")
    row8k = next(ln for ln in dec.splitlines() if ln.startswith("| 8K |"))
    assert row8k.split(" | ")[-1].endswith(f"{fmt.FLAG_MARK} Long ramp |")
    assert row8k.count(fmt.FLAG_MARK) == 1  # only the flagged cell
    assert fmt.FLAGGED_LEGEND in dec
    assert 'class="valid flagged"' in page and '<span class="f">' in page


def test_no_flag_legend_without_flags(tmp_path, small):
    doc = copy.deepcopy(small)
    for c in doc["cells"]:
        c["flags"] = []
    md, _, _ = _render(tmp_path, doc)
    assert fmt.FLAG_MARK not in _section(md, "Sustained decode")
    assert "**Flagged cells:** None of" in md


def test_legends_only_for_statuses_present(tmp_path, small):
    md, _, _ = _render(tmp_path, small)
    assert fmt.QUEUED_LEGEND not in md  # no cell is queued
    assert md.count(fmt.OVER_CAPACITY_LEGEND) == 2  # grid and All measurements
    doc = copy.deepcopy(small)
    for c in doc["cells"]:
        if c["status"] == "over_capacity":
            c["status"] = "valid"
    md, _, _ = _render(tmp_path, doc)
    assert fmt.OVER_CAPACITY_LEGEND not in md and fmt.QUEUED_LEGEND not in md


def test_failed_sentence_only_beside_cells_that_failed(tmp_path, small):
    # a cell never run (the server stopped answering) is not "too many requests failed"
    doc = copy.deepcopy(small)
    cell = next(c for c in doc["cells"] if (c["context"], c["concurrency"]) == (16384, 4))
    cell.update(
        status="error",
        not_run="server_unreachable",
        errors={},
        errors_total=0,
        measured_s=None,
        reason="server unreachable: refused; not run",
    )
    md, _, _ = _render(tmp_path, doc)
    dec = _section(md, "Sustained decode")
    assert fmt.ERROR_FAILED_LEGEND not in md
    assert md_text(fmt.NOT_RUN_LEGEND, 10_000) in dec
    assert "| Not run |" in next(ln for ln in dec.splitlines() if ln.startswith("| 16K |"))

    # a cell that ran and failed: the sentence, and no figures beside it anywhere
    doc = copy.deepcopy(small)
    cell = next(c for c in doc["cells"] if (c["context"], c["concurrency"]) == (16384, 4))
    cell.update(status="error", errors={"http_500": 9}, errors_total=9)
    md, _, _ = _render(tmp_path, doc)
    assert fmt.ERROR_FAILED_LEGEND in _section(md, "Sustained decode")
    row = next(
        ln for ln in _section(md, "All measurements").splitlines() if "| 16K | 4 | Error |" in ln
    )
    assert fmt.tok_s(cell["total_tok_s"]) not in row and row.count(fmt.DASH) == 8
    ci = _section(md, "Confidence intervals and tails")
    assert "| 16K | 4 | Error |" not in ci


def test_estimated_tokens_legend_agrees_with_the_metrics_doc():
    doc = (DOCS / "metrics.md").read_text()
    row = next(ln for ln in doc.splitlines() if ln.startswith("| `estimated_tokens` |"))
    assert "per chunk" in row and "not from usage" in row
    text = report_cells.FLAG_TEXT["estimated_tokens"]
    assert "one per streamed chunk" in text and "not taken from the server's usage" in text


def test_every_chart_title_names_the_run(tmp_path):
    d = synthetic.shared_run("full")
    run = load(d)
    line = plots.run_line(run)
    assert line == "Muse-Glimmer-30B · H200 NVL 141GB · sglang 0.5.6.post3.dev9265 · 8 s window"
    figs = plots.all_figures(run)
    assert len(figs) >= 7
    for name, fig in figs.items():
        title = fig.axes[0].get_title(loc="left")
        assert title.endswith("\n" + line), (name, title)
        assert "decode-c" not in title, (name, title)  # readable cell names, not ids


def test_per_request_axis_starts_at_zero_and_bands_are_light_or_off():
    run = load(synthetic.shared_run("full"))
    fig = plots.per_request_vs_concurrency(run)
    assert fig.axes[0].get_ylim()[0] == 0
    bands = [c for c in fig.axes[0].collections if type(c).__name__ == "FillBetweenPolyCollection"]
    assert bands and all(c.get_alpha() <= 0.1 for c in bands)
    fig = plots.per_request_vs_concurrency(run, bands=False)
    bands = [c for c in fig.axes[0].collections if type(c).__name__ == "FillBetweenPolyCollection"]
    assert bands == []


def test_heatmap_marks_flagged_cells():
    run = load(synthetic.shared_run("full"))
    fig = plots.decode_heatmap(run)
    ax = fig.axes[0]
    marks = [p for p in ax.patches if type(p).__name__ == "Polygon"]
    groups = report_cells.decode_cells(run)
    st = run.statuses()
    md = run.matrix_definition
    want = sum(
        1
        for i, c in enumerate(md["contexts"])
        for j, n in enumerate(md["concurrency"])
        if st.iat[i, j] in ("valid", "queued") and report_cells.cell_flags(groups.get((c, n), []))
    )
    assert want >= 3 and len(marks) == want
    assert ax.get_legend() is not None
    assert "flagged" in ax.get_legend().get_texts()[0].get_text()


def test_summary_of_a_run_with_no_decode_cells(tmp_path):
    doc = json.loads((synthetic.shared_run("full") / "run.json").read_text())
    doc["cells"] = [c for c in doc["cells"] if c["phase"] == "prefill"]
    md, _, _ = _render(tmp_path, doc)
    assert "**Peak throughput:** No decode cell was measured." in md


def test_queued_legend_only_when_a_cell_is_queued(tmp_path, small):
    full = load(synthetic.shared_run("full"))
    texts = [
        t.get_text() for t in plots.total_vs_concurrency(full).axes[0].get_legend().get_texts()
    ]
    assert "requests queued" in texts
    write_run(tmp_path, small)  # no queued cell
    run = load(tmp_path)
    texts = [t.get_text() for t in plots.total_vs_concurrency(run).axes[0].get_legend().get_texts()]
    assert "requests queued" not in texts


def test_close_contexts_share_one_tick_label():
    run = load(synthetic.shared_run("full"))
    ax = plots.prefill_vs_context(run).axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert "123K/128K" in labels and "128K" not in labels


def test_html_is_rendered_from_templates_with_escaping(tmp_path, small):
    from speedmatrix.report import html as html_mod

    assert (html_mod.TEMPLATES / "page.html.j2").is_file()
    doc = copy.deepcopy(small)
    doc["meta"]["target"]["model_name"] = "<script>alert(1)</script>"
    _, page, _ = _render(tmp_path, doc)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_intervals_table_shows_both_per_request_figures(tmp_path, small):
    doc = copy.deepcopy(small)
    cell = next(c for c in doc["cells"] if c["phase"] == "decode" and c["status"] == "valid")
    # a chunking server: 1000 / median TBT reads high, the per-request decode rate does not
    cell.update(per_request_tok_s=171.0, decode_tok_s_per_request=123.4)
    cell.setdefault("ci", {})["decode_tok_s_per_request"] = [120.1, 126.7]
    md, _, _ = _render(tmp_path, doc)
    ci = _section(md, "Confidence intervals and tails")
    assert "Decode tok/s per request" in ci and "1000 / the median time between tokens" in ci
    row = next(
        ln
        for ln in ci.splitlines()
        if ln.startswith(f"| {cell['label']} | {fmt.count(cell['concurrency'])} |")
    )
    assert fmt.tok_s(123.4) in row and fmt.tok_s(171.0) in row
    assert fmt.ci(120.1, 126.7, fmt.tok_s) in row
