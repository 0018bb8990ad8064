"""The report of a run, assembled from its sections (`metadata`, `summary`, `measurements`,
`rates`, `goodput`); the sections read the cells' figures and verdicts and word them, and
`markdown` and `html` render the result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import by_rate, missing_cells
from speedmatrix.report.goodput import goodput_section, slo_capacity_section, summary_items
from speedmatrix.report.measurements import (
    all_section,
    ci_section,
    decode_section,
    errors_section,
    flags_section,
    missing_section,
    prefill_section,
    server_section,
)
from speedmatrix.report.metadata import (
    engine_section,
    hardware_section,
    header_lines,
    kv_capacity_section,
    launch_section,
    run_section,
    sources_section,
    warnings_section,
)
from speedmatrix.report.model import Report, Section
from speedmatrix.report.predicted import predicted_section
from speedmatrix.report.prefixcache import prefix_cache_section
from speedmatrix.report.rates import open_loop_section, rate_matrix_line
from speedmatrix.report.summary import rate_summary_section, summary_section
from speedmatrix.report.traffic import interference_section, session_section, trace_section

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


def build(run: Run, slo: Any = None) -> Report:
    """The report of ``run``; ``slo`` (`speedmatrix.report.goodput.SloSettings`, None for a
    run without an SLO) adds the goodput grid and the capacity at that SLO."""
    title, subtitle, engine_line, matrix_line = header_lines(run)
    if by_rate(run):
        matrix_line = rate_matrix_line(run)
    notes = []
    if run.interrupted:
        n_miss = len(missing_cells(run))
        notes.append(
            "This run was interrupted"
            + (f": {fmt.plural(n_miss, 'cell')} of the matrix not measured." if n_miss else ".")
        )
    warns = warnings_section(run)
    if warns is not None:
        notes.append(f"The run recorded {fmt.plural(len(warns.text), 'warning')}: see Warnings.")
    guessed = predicted_section(run)
    if guessed is not None:
        notes.append(
            "Some cells of this report were predicted by the twin, not measured: they are "
            "marked predicted, with their intervals and the model's limits (see Predicted cells)."
        )
    summ = summary_section(run)
    if by_rate(run):
        summ = rate_summary_section(run)
    if slo is not None:
        summ.items = (summ.items or []) + summary_items(run, slo)
    load_views = []
    if slo is not None:
        load_views += [goodput_section(run, slo), slo_capacity_section(run, slo)]
    ol = open_loop_section(run)
    if ol is not None:
        load_views.append(ol)
    for view in (
        prefix_cache_section(run.all_cells),
        interference_section(run.all_cells),
        trace_section(run.all_cells),
        session_section(run.all_cells),
    ):
        if view is not None:
            load_views.append(view)
    sections = [
        summ,
        hardware_section(run),
        engine_section(run),
        run_section(run),
        launch_section(run),
        prefill_section(run),
        decode_section(run),
        *([guessed] if guessed is not None else []),
        *load_views,
        all_section(run),
        ci_section(run),
        flags_section(run),
        server_section(run),
        kv_capacity_section(run),
    ]
    for extra in (sources_section(run), warns, errors_section(run), missing_section(run)):
        if extra is not None:
            sections.append(extra)
    sections.append(
        Section(
            "Charts",
            anchor="charts",
            charts=["ttft_vs_context", "tbt_distribution", "throughput_over_time"],
        )
    )
    return Report(title, subtitle, engine_line, matrix_line, notes, sections)
