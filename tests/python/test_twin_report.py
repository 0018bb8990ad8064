"""The report never shows a predicted cell as measured: the grid, the table of measurements,
the summary and the charts mark it, and the model's limits stand beside it (issue 24)."""

from __future__ import annotations

import speedmatrix as sm
from speedmatrix.report.predicted import predicted_keys
from speedmatrix.report.tables import build
from speedmatrix.runfile import write_run
from speedmatrix.sim import load_profile
from speedmatrix.twin.predictrun import LIMITS, with_predictions
from twin_synthetic import write_engine_run

TRUTH = load_profile("seed-h200")
MEASURED = [(8192, 1), (8192, 64), (65536, 1), (65536, 16), (125952, 8), (16384, 32)]
CONTEXTS = [8192, 16384, 65536, 125952]
LEVELS = [1, 8, 16, 32, 64]


def _sparse_run(tmp_path) -> sm.Run:
    run_dir = write_engine_run(tmp_path / "run", TRUTH, MEASURED)
    profile = sm.fit(run_dir)
    doc = with_predictions(sm.load(run_dir).doc, profile, CONTEXTS, LEVELS, source="fit.json")
    write_run(run_dir, doc)
    return sm.load(run_dir)


def _row(md: str, first: str) -> str:
    return next(line for line in md.splitlines() if line.startswith(f"| {first} |"))


def test_predicted_cells_are_marked_everywhere_and_measured_ones_are_not(tmp_path) -> None:
    run = _sparse_run(tmp_path)
    guessed = predicted_keys(run)
    assert len(guessed) == len(CONTEXTS) * len(LEVELS) - len(MEASURED)
    assert not guessed & set(MEASURED)
    sm.write_report(tmp_path / "run")
    md = (tmp_path / "run" / "report.md").read_text()
    grid = md.split("## Sustained decode", 1)[1].split("##", 1)[0]
    row_8k = _row(grid, "8K").split("|")[2:-1]  # N = 1, 8, 16, 32, 64
    assert "predicted" not in row_8k[0] and "predicted" not in row_8k[4]  # measured
    assert all("predicted" in cell for cell in row_8k[1:4])
    assert "–" in row_8k[1]  # the interval under the figure
    assert LIMITS in grid
    table = md.split("## All measurements", 1)[1].split("##", 1)[0]
    lines = [ln for ln in table.splitlines() if ln.startswith("| Sustained decode")]
    assert sum("(predicted)" in ln for ln in lines) == len(guessed)
    assert sum("(predicted)" not in ln for ln in lines) == len(MEASURED)
    summary = md.split("## Summary", 1)[1].split("##", 1)[0]
    assert f"of {len(MEASURED)} measured cells" in summary
    assert f"{len(guessed)} decode cells predicted" in summary
    section = md.split("## Predicted cells", 1)[1].split("\n## ", 1)[0]
    assert "Fitted to:** 6 measured cells" in section and "speculative decoding" in section
    html = (tmp_path / "run" / "report.html").read_text()
    assert html.count("predicted") >= len(guessed) and 'td class="valid predicted"' in html


def test_a_fully_measured_run_says_nothing_of_predictions(tmp_path) -> None:
    run_dir = write_engine_run(tmp_path / "run", TRUTH, MEASURED)
    report = build(sm.load(run_dir))
    assert all(s.title != "Predicted cells" for s in report.sections)
    assert not any("predicted" in n for n in report.notes)
