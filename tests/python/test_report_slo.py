"""The report's load and SLO views (issue 13): the goodput / attainment grid, the capacity
answer (table and chart) and, for open-loop runs, latency from the schedule beside latency
from the send. The grid's numbers must be `Run.load_matrix`'s, the capacity table
`Run.capacity`'s, and the below-target marks and legend must appear exactly where a cell
misses the target attainment."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import synthetic
from speedmatrix import slo as slo_mod
from speedmatrix.report import cells as report_cells
from speedmatrix.report import formatting as fmt
from speedmatrix.report import goodput, render_report, write_report
from speedmatrix.results import load
from speedmatrix.runfile import read_run, write_run


def _tbt_split(run) -> float:
    """A TPOT target (ms) between the fastest and slowest streams: it splits the loads."""
    tbt = sorted(c["tbt_ms"] for c in run.doc["cells"] if c.get("tbt_ms"))
    return (tbt[0] + tbt[-1]) / 2


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("slo") / "base"
    synthetic.build_run(
        d, contexts=(8192, 32768), concurrency=(1, 4, 16, 64), prefill_contexts=(), duration_s=2.0
    )
    return d


def _with_recorded_slo(src, dst, targets: dict, share: float):
    """A copy of ``src`` measured "with --slo": meta.run.matrix holds the SLO and every
    decode cell its `slo.evaluate` figures (as the sweep writes them)."""
    shutil.copytree(src, dst)
    doc = read_run(dst)
    run = load(dst)
    doc["meta"].setdefault("run", {}).setdefault("matrix", {}).update(
        {"slo": targets, "attainment": share}
    )
    for c in doc["cells"]:
        if c["phase"] == "decode" and c.get("records"):
            rec = run.records(c["id"])
            c["slo"] = slo_mod._json_ready(
                slo_mod.evaluate(rec.requests, rec.events, c["t0_ns"], c["t1_ns"], targets)
            )
    write_run(dst, doc, secrets=synthetic.SECRETS)
    return load(dst)


def _section(md: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", md, re.MULTILINE | re.DOTALL)
    assert m, f"no section {title!r}"
    return m.group(1)


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    split = [[x.strip() for x in ln.strip("|").split(" | ")] for ln in lines]
    return split[0], split[2:]


def _check_grid(run, md: str, share: float) -> int:
    """The goodput grid equals load_matrix cell by cell; returns how many cells are below."""
    req = run.load_matrix("slo_goodput_req_s", numeric=True)
    tok = run.load_matrix("slo_goodput_tok_s", numeric=True)
    att = run.load_matrix("slo_attainment", numeric=True)
    status = run.load_matrix("slo_attainment")
    sec = _section(md, "Goodput at SLO")
    head, rows = _table(sec)
    assert head[1:] == [f"{x:g}" for x in att.columns]
    below = 0
    for row in rows:
        label = row[0]
        for x, cell in zip(att.columns, row[1:]):
            lines = [ln for ln in cell.split("<br>") if ln != "Requests queued"]
            a = att.loc[label, x]
            if np.isnan(a):
                want = status.loc[label, x]
                if want in ("Valid", "Requests queued"):  # measured, but nothing judged
                    assert "no requests judged" in lines, cell
                elif isinstance(want, str):  # the cell's status text
                    assert lines[0] == want, (label, x, cell)
                else:  # no cell at this load
                    assert lines[0] in (fmt.DASH, "Not measured"), (label, x, cell)
                continue
            r, t = report_cells.rate_text(req.loc[label, x]), fmt.tok_s(tok.loc[label, x])
            rate = report_cells.by_rate(run)  # the headline: req/s in open loop, tok/s in closed
            assert lines[:2] == ([r, f"{t} tok/s"] if rate else [t, f"{r} req/s"]), cell
            assert lines[2] == f"{a * 100:.1f}% met"
            is_below = a < share
            assert any(ln.startswith(goodput.BELOW_MARK) for ln in lines) == is_below, cell
            below += is_below
    assert ("Below target:" in sec) == (below > 0)
    return below


def _check_capacity(run, md: str, targets: dict, share: float):
    caps = run.capacity(targets, share)
    assert caps
    _, rows = _table(_section(md, "Capacity at SLO"))
    by_label = {r[0]: r for r in rows}
    for cap in caps.values():
        row = by_label[cap["label"]]
        assert row[1] == report_cells.load_text(cap["passing"], False)
        assert row[2] == report_cells.load_text(cap["failing"], False)
        assert row[3] == goodput.estimate_text(cap)
        assert row[4] == cap["method"]
    return caps


def test_recorded_slo_grid_and_capacity_equal_the_run_api(base_dir, tmp_path):
    base = load(base_dir)
    targets = {"tpot": _tbt_split(base)}
    run = _with_recorded_slo(base_dir, tmp_path / "r", targets, 0.9)
    md_path, html_path = write_report(run.path)
    md, html = md_path.read_text(), html_path.read_text()
    below = _check_grid(run, md, 0.9)
    assert below > 0  # the target splits the loads: some cells pass, some do not
    caps = _check_capacity(run, md, targets, 0.9)
    assert any(c["passing"] and c["failing"] for c in caps.values())
    # the estimate lies between the bracket, and the summary leads with it
    for c in caps.values():
        if c["estimate"] is not None:
            assert c["passing"] <= c["estimate"] <= c["failing"]
    assert "- **Capacity at SLO:**" in _section(md, "Summary")
    # HTML: the same grid, the marked cells carry the class, and the chart is inline
    assert html.count('class="valid below') + html.count('class="queued below') == below
    assert 'class="b">' + goodput.BELOW_MARK in html
    assert 'id="chart-capacity_vs_load"' in html
    assert (run.path / "plots" / "capacity_vs_load.svg").is_file()


def test_no_mark_and_no_legend_when_every_cell_meets_the_target(base_dir, tmp_path):
    run = _with_recorded_slo(base_dir, tmp_path / "easy", {"tpot": 10_000.0}, 0.95)
    md, html, _ = render_report(run, charts=False)
    assert _check_grid(run, md, 0.95) == 0
    assert goodput.BELOW_MARK not in md and "below" not in re.findall(r'class="([^"]*)"', html)
    caps = _check_capacity(run, md, {"tpot": 10_000.0}, 0.95)
    # every measured cell passes: only a cell that did not run (over capacity) can fail
    st = run.statuses()
    for c in caps.values():
        if c["failing"] is not None:
            assert st.loc[c["label"], int(c["failing"])] in ("over_capacity", "error")


@pytest.fixture(scope="module")
def base_report(base_dir):
    """(markdown, html, svgs) of the run without an SLO, charts drawn: drawn once."""
    return render_report(load(base_dir))


def test_a_run_without_slo_has_no_slo_views_until_the_report_asks(base_dir, base_report):
    run = load(base_dir)
    md, _, svgs = base_report
    assert "## Goodput at SLO" not in md and "## Capacity at SLO" not in md
    assert "capacity_vs_load" not in svgs
    # asked of the report: each cell re-judged from its records, the same numbers as a run
    # measured with that SLO
    targets = {"tpot": _tbt_split(run)}
    md, _, svgs = render_report(run, slo=slo_mod.format_slo(targets), attainment="90%")
    judged = goodput.judged(run, targets)
    _check_grid(judged, md, 0.9)
    _check_capacity(run, md, targets, 0.9)
    assert "(asked of this report; not the run's)" in md
    assert "capacity_vs_load" in svgs
    from speedmatrix.report.plots import run_line

    assert run_line(run).split(" · ")[0] in svgs["capacity_vs_load"]  # titled as the others


def test_report_cli_takes_slo_and_attainment(base_dir, tmp_path, capsys):
    from speedmatrix import cli

    d = tmp_path / "cli"
    shutil.copytree(base_dir, d)
    assert cli.main(["report", str(d), "--slo", "tpot=40ms", "--attainment", "80%"]) == 0
    md = (d / "report.md").read_text()
    assert "- **SLO:** tpot=40ms (asked of this report; not the run's)" in md
    assert "- **Target attainment:** 80.0%" in md
    assert cli.main(["report", str(d), "--slo", "speed=1s"]) == 2
    assert "NAME=DURATION" in capsys.readouterr().err


def test_error_and_over_capacity_cells_keep_their_status_in_the_grid(tmp_path):
    d = tmp_path / "seedish"
    synthetic.build_run(d, contexts=(8192, 32768, 125952), concurrency=(1, 16, 128),
                        prefill_contexts=(), duration_s=2.0)  # fmt: skip
    base = load(d)
    run = _with_recorded_slo(d, tmp_path / "s", {"tpot": _tbt_split(base)}, 0.9)
    md, _, _ = render_report(run, charts=False)
    _, rows = _table(_section(md, "Goodput at SLO"))
    grid = {r[0]: r[1:] for r in rows}
    st = run.statuses()
    for label in st.index:
        for j, n in enumerate(st.columns):
            if st.loc[label, n] == "over_capacity":
                assert grid[label][j] == "Over capacity"
            elif st.loc[label, n] == "error":
                assert grid[label][j].startswith("Error")
    assert "Over capacity: not run" in _section(md, "Goodput at SLO")


# ------------------------------------------------------------ a real open-loop run (e2e tier)
@pytest.fixture(scope="module")
def open_run(tmp_path_factory):
    from speedmatrix import cli
    from speedmatrix.sim import Sim

    out = tmp_path_factory.mktemp("open") / "run"
    # test-batch runs 4 at once (~20 requests/s of 16 tokens): 8/s keeps up, 60/s cannot
    with Sim("test-batch") as sim:
        code = cli.main(
            ["run", "--url", sim.url, "--contexts", "256", "--request-rate", "8,60",
             "--max-concurrency", "4", "--duration", "2s", "--max-output", "16",
             "--slo", "ttft=300ms,e2e=1s", "--percentiles", "50,99", "--out", str(out),
             "--quiet"]
        )  # fmt: skip
    assert code == 0
    return load(out)


@pytest.mark.e2e
def test_open_loop_report_shows_rates_goodput_and_both_latency_views(open_run):
    run = open_run
    md = (run.path / "report.md").read_text()
    assert "1 context (256) × 2 request rates (8, 60 req/s)" in md
    _, rows = _table(_section(md, "Sustained decode"))
    assert len(rows) == 1 and len(rows[0]) == 3  # 256 × {8, 60}: no concurrency columns
    assert "## Not measured" not in md
    below = _check_grid(run, md, 0.95)
    assert below == 1  # 60/s is far past what the engine holds; 8/s is met
    caps = run.capacity("ttft=300ms,e2e=1s", "95%")
    assert (caps[256]["passing"], caps[256]["failing"]) == (8, 60)
    _, cap_rows = _table(_section(md, "Capacity at SLO"))
    assert cap_rows[0][1:3] == ["8 req/s", "60 req/s"]
    assert cap_rows[0][3] == goodput.estimate_text(caps[256])
    sec = _section(md, "Open loop")
    _, ol = _table(sec)
    cells = {c["rate_per_s"]: c for c in run.doc["cells"] if c["phase"] == "decode"}
    for row in ol:
        c = cells[float(row[1].split()[0])]
        lat = c["latency"]
        assert row[9] == (
            f"{fmt.ms(lat['e2e_sched_ms']['median'])} / {fmt.ms(lat['e2e_ms']['median'])}"
        )
        assert row[10] == f"{fmt.ms(lat['e2e_sched_ms']['p99'])} / {fmt.ms(lat['e2e_ms']['p99'])}"
        assert row[-1] == ("yes" if c["open_loop"]["kept_up"] else "no")
    behind = [c for c in cells.values() if not c["open_loop"]["kept_up"]]
    assert [c["rate_per_s"] for c in behind] == [60.0]
    assert (
        f"The server could not keep up at 256 context × 60 req/s: "
        f"{behind[0]['open_loop']['reason']}." in sec
    )
    assert sec.count("could not keep up at") == 1
    # the concurrency charts, which have no rate axis, are left out; the capacity chart is in
    charts = {p.stem for p in (run.path / "plots").glob("*.svg")}
    assert "capacity_vs_load" in charts and "decode_heatmap" not in charts
    doc = json.loads((run.path / "run.json").read_text())
    assert doc["meta"]["run"]["matrix"]["slo"] == {"ttft": 300.0, "e2e": 1000.0}


@pytest.mark.e2e
def test_a_search_run_reports_its_measured_points_and_its_answer(tmp_path):
    from speedmatrix import cli
    from speedmatrix.sim import Sim

    out = tmp_path / "search"
    with Sim("test-batch") as sim:  # runs 4 at once: a 60 ms TTFT holds up to about N = 4
        code = cli.main(
            ["run", "--url", sim.url, "--contexts", "256", "--concurrency", "1",
             "--search", "concurrency", "--slo", "ttft=60ms", "--duration", "1.5s",
             "--max-output", "8", "--out", str(out), "--quiet"]
        )  # fmt: skip
    assert code == 0
    run = load(out)
    md = (out / "report.md").read_text()
    _check_grid(run, md, 0.95)
    sec = _section(md, "Goodput at SLO")
    assert "Not measured" not in sec  # a sparse grid is the search's design, not a gap
    found = run.doc["meta"]["run"]["search"]["256"]
    _, rows = _table(_section(md, "Capacity at SLO"))
    assert rows[0][1] == report_cells.load_text(found["passing"], False)
    assert f"(--search: {found['cells']} cells, converged)" in rows[0][5]


def _open_cell(rate, kept_up, status="valid", e2e=(200.0, 210.0), sched=(250.0, 400.0)):
    cid = f"decode-c512-q{rate:g}-r0"
    cell = {
        "id": cid,
        "phase": "decode",
        "context": 512,
        "label": "512",
        "concurrency": 4,
        "repetition": 0,
        "status": status,
        "rate_per_s": rate,
        "flags": [] if kept_up else ["behind"],
    }
    if status == "over_capacity":  # as the sweep writes one: figures null, nothing counted
        cell.update({k: None for k in ("total_tok_s", "per_request_tok_s", "prompt_tok_s")})
        cell.update({"ttft_ms": None, "tbt_ms": None, "avg_active": None, "completed": 0})
        cell.update({"output_tokens": 0, "measured_s": 0.0, "errors": {}, "reason": "KV"})
        return cell
    cell.update(
        {
            "total_tok_s": 100.0 * rate,
            "per_request_tok_s": 50.0,
            "prompt_tok_s": None,
            "tbt_ms": 20.0,
            "avg_active": 2.0,
            "completed": int(10 * rate),
            "output_tokens": int(160 * rate),
            "measured_s": 10.0,
            "ttft_ms": 12.0,
            "errors": {},
            "open_loop": {
                "rate_per_s": rate,
                "arrivals": int(10 * rate),
                "achieved_rate_per_s": rate if kept_up else rate / 2,
                "completed": int(10 * rate),
                "failed": 0,
                "cancelled": 0 if kept_up else 3,
                "in_flight_max": 4,
                "kept_up": kept_up,
                "reason": "" if kept_up else "an arrival was unfinished at the drain bound",
            },
            "latency": {
                "e2e_ms": {"n": 10, "median": e2e[0], "p50": e2e[0]},
                "e2e_sched_ms": {"n": 10, "median": sched[0], "p50": sched[0]},
                "ttft_ms": {"n": 10, "median": 12.0, "p50": 12.0},
                "ttft_sched_ms": {"n": 10, "median": 60.0, "p50": 60.0},
            },
        }
    )
    return cell


def test_open_loop_table_from_the_cells_without_a_tail_percentile():
    from speedmatrix.results import Run

    doc = {
        "schema": "speedmatrix.run/1",
        "meta": {
            "run": {
                "matrix": {
                    "contexts": [512, 2048],
                    "request_rates": [2.0, 8.0],
                    "percentiles": [50.0],  # no tail: the p99 column is left out
                    "arrival": "gamma:0.5",
                }
            }
        },
        "cells": [
            _open_cell(2.0, True),
            _open_cell(8.0, False),
            {**_open_cell(2.0, True, "over_capacity"), "context": 2048, "label": "2K"},
        ],
    }
    md, _, _ = render_report(Run(doc), charts=False)
    sec = _section(md, "Open loop")
    head, rows = _table(sec)
    assert "E2E p99: from schedule / from send" not in head and len(head) == 11
    assert all(len(r) == 11 for r in rows)
    assert rows[0][1:4] == ["2 req/s", "Valid", "2.00 req/s"]
    assert rows[1][6] == "3" and rows[1][-1] == "no"  # unfinished at the drain bound
    assert rows[1][9] == "250 ms / 200 ms"
    assert rows[2][2] == "Over capacity"
    assert sec.count("could not keep up at") == 1
    assert "- **Arrivals:** gamma:0.5 arrivals" in sec
    # the decode grid goes by rate, not by the gate's concurrency
    head, drows = _table(_section(md, "Sustained decode"))
    assert head == ["Context", "2", "8"] and drows[1][1] == "Over capacity"
    assert "## Goodput at SLO" not in md  # no SLO recorded: no goodput views


def test_a_request_rate_runs_tables_go_by_rate_in_the_api_too():
    # Run.table / status_table / statuses / missing_cells place a rate run's cells by their
    # rate (the gate's concurrency is the same 4 for every rate and used to collapse them)
    from speedmatrix.results import Run

    doc = {
        "schema": "speedmatrix.run/1",
        "meta": {"run": {"matrix": {"contexts": [512, 2048], "request_rates": [2.0, 8.0]}}},
        "cells": [_open_cell(2.0, True), _open_cell(8.0, False)],
    }
    run = Run(doc)
    t = run.table("total_tok_s")
    assert t.columns.name == "request_rate" and list(t.columns) == [2.0, 8.0]
    assert t.loc["512"].tolist() == [200.0, 800.0]
    assert run.status_table("total_tok_s").loc["2K"].tolist() == ["Not measured"] * 2
    assert run.statuses().loc["512"].tolist() == ["valid", "valid"]
    assert run.missing_cells() == [("decode", 2048, 2.0), ("decode", 2048, 8.0)]
    md, _, _ = render_report(run, charts=False)
    _, rows = _table(_section(md, "Not measured"))
    assert [r[1:] for r in rows] == [["2K", "2 req/s"], ["2K", "8 req/s"]]


def test_a_run_whose_every_cell_is_over_capacity_still_reports_its_slo_views():
    from speedmatrix.results import Run

    cells = [_open_cell(r, True, "over_capacity") for r in (2.0, 8.0)]
    doc = {
        "schema": "speedmatrix.run/1",
        "meta": {"run": {"matrix": {"request_rates": [2.0, 8.0], "slo": {"ttft": 500.0}}}},
        "cells": cells,
    }
    md, _, svgs = render_report(Run(doc))
    _, rows = _table(_section(md, "Goodput at SLO"))
    assert rows == [["512", "Over capacity", "Over capacity"]]
    _, caps = _table(_section(md, "Capacity at SLO"))
    assert caps[0][1:4] == [fmt.DASH, "2 req/s", "below 2 req/s"]  # over capacity fails
    assert "capacity_vs_load" in svgs


def test_a_cell_with_nothing_judged_says_so_and_why(base_dir, tmp_path):
    base = load(base_dir)
    run = _with_recorded_slo(base_dir, tmp_path / "nj", {"tpot": _tbt_split(base)}, 0.9)
    md, _, _ = render_report(run, charts=False)
    assert "No requests judged" not in md and "no requests judged" not in md
    # a closed-loop cell whose window judged nothing (as evaluate leaves it: attainment null)
    doc = read_run(run.path)
    cell = next(c for c in doc["cells"] if c["phase"] == "decode" and c["status"] == "valid")
    cell["slo"].update({"counted": 0, "met": 0, "attainment": None})
    cell["slo"].update({"goodput_req_s": 0.0, "goodput_tok_s": 0.0})
    write_run(run.path, doc, secrets=synthetic.SECRETS)
    run = load(run.path)
    md, _, _ = render_report(run, charts=False)
    _check_grid(run, md, 0.9)
    note = "No requests judged (1 measured cell): no request of the cell completed inside"
    assert note in _section(md, "Goodput at SLO") and note in _section(md, "Capacity at SLO")
    assert _section(md, "Goodput at SLO").count("no requests judged") == 1


def test_a_run_without_prefill_cells_draws_no_empty_prefill_chart(base_report):
    _, _, svgs = base_report
    assert "prefill_vs_context" not in svgs and "decode_heatmap" in svgs
