"""`run --plan sparse`: the design, the stopping rule and the plan's fields (synthetic
inputs; the run itself against the built-in engine is in test_twin_sparse_e2e.py)."""

from __future__ import annotations

import dataclasses

import pytest
from speedmatrix.cli.main import build_parser
from speedmatrix.cli.run import matrix_from_args
from speedmatrix.cliargs import UsageError
from speedmatrix.matrix import Matrix
from speedmatrix.twin.model import PredictedCell
from speedmatrix.twin.sparse import budget, design, knee, next_cell, relative_half_width


def _grid(contexts, levels, over=()):
    return [(c, n) for c in contexts for n in levels if (c, n) not in over]


@pytest.mark.parametrize(
    ("levels", "max_running", "expected"),
    [
        ([1, 8, 32, 128], None, 8),  # geometric middle of 1..128 is 11.3: 8 is nearest
        ([1, 8, 32, 128], 256, 8),  # every level runs at once: the middle again
        ([1, 8, 32, 128], 32, 32),  # beyond 32 requests queue: the knee is 32
        ([1, 4, 16, 64, 256], 100, 64),
        ([1, 128], 64, None),  # no level between the ends
        ([1, 8, 512], 512, 8),  # the limit is the highest level: no queueing, the middle
    ],
)
def test_the_knee_of_the_concurrency_axis(levels, max_running, expected) -> None:
    assert knee(levels, max_running) == expected


@pytest.mark.parametrize(
    ("grid", "max_running", "most", "expected"),
    [
        (
            _grid([1024, 4096, 8192], [1, 8, 32, 128]),
            None,
            10,
            [(1024, 1), (8192, 128), (1024, 128), (1024, 8), (8192, 1), (8192, 8), (4096, 8)],
        ),
        (  # the longest context's highest runnable level is its corner
            _grid([1024, 4096, 8192], [1, 8, 32, 128], over={(8192, 128)}),
            None,
            4,
            [(1024, 1), (8192, 32), (1024, 128), (1024, 8)],
        ),
        (  # beyond max_running 32 requests queue: the knee is 32, and 128 runs its batch
            # (one of the two per context), so 8 is the third batch size
            _grid([1024, 8192], [1, 8, 32, 128]),
            32,
            10,
            [(1024, 1), (8192, 128), (1024, 32), (1024, 8), (8192, 1)],
        ),
        (  # llama.cpp's 4 slots (tests/python/test_twin_llamacpp.py): batches 1, 2 and 4
            _grid([128, 512, 1024, 1920], [1, 2, 4, 6]),
            4,
            6,
            [(128, 1), (1920, 6), (128, 4), (128, 2), (1920, 1), (1024, 4)],
        ),
        (_grid([2048], [1, 64]), None, 10, [(2048, 1), (2048, 64)]),  # one row, two levels
        ([], None, 10, []),
    ],
)
def test_the_design_is_the_corners_and_the_knee(grid, max_running, most, expected) -> None:
    assert design(grid, max_running, most) == expected


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        # split slots: 2 of 4 busy may run in 2 passes, so level 2 pins nothing and the
        # design keeps the full and single batches at both ends
        ("per_slot", [(128, 1), (1920, 6), (128, 6), (1920, 1), (1024, 4)]),
        ("unified_slots", [(128, 1), (1920, 6), (128, 4), (128, 2), (1920, 1), (1024, 4)]),
    ],
)
def test_the_design_leaves_out_levels_that_split_slots_may_split(family, expected) -> None:
    grid = _grid([128, 512, 1024, 1920], [1, 2, 4, 6])
    assert design(grid, 4, 6, family) == expected


@pytest.mark.parametrize(
    ("grid_size", "max_cells", "expected"),
    [(46, 0, 18), (12, 0, 4), (11, 0, 4), (20, 0, 8), (3, 0, 3), (12, 7, 7), (5, 9, 5)],
)
def test_the_budget_is_40_percent_of_the_grid_at_least_four(grid_size, max_cells, expected):
    assert budget(grid_size, max_cells) == expected


def _p(tok_s: float, half: float, status: str = "valid") -> PredictedCell:
    if status == "over_capacity":
        return PredictedCell(1, 1, status, None, None, None, None, None, None)
    tbt = 1000.0 / tok_s
    return PredictedCell(
        1, 1, status, tok_s, tok_s * (1 - half), tok_s * (1 + half), tbt, tbt * 0.99, tbt * 1.01
    )


def test_the_relative_half_width_is_the_widest_figures() -> None:
    assert relative_half_width(_p(100.0, 0.2)) == pytest.approx(0.2)
    assert relative_half_width(_p(100.0, 0.001)) == pytest.approx(0.01)  # TBT's ±1 %
    assert relative_half_width(_p(100.0, 0.5, "over_capacity")) == 0.0


@pytest.mark.parametrize(
    ("widths", "measured", "most", "cell", "why"),
    [
        ({(1, 1): 0.05, (1, 2): 0.30, (2, 1): 0.12}, 4, 8, (1, 2), "widest"),
        ({(1, 1): 0.05, (1, 2): 0.08}, 4, 8, None, "target"),  # all within 10 %
        ({(1, 1): 0.05, (1, 2): 0.30}, 8, 8, None, "budget"),  # the budget is spent
        ({}, 4, 8, None, "done"),
        ({(2, 1): 0.2, (1, 2): 0.2}, 0, 8, (1, 2), "widest"),  # a tie: the lower cell
    ],
)
def test_the_stopping_rule(widths, measured, most, cell, why) -> None:
    predictions = {k: _p(100.0, w) for k, w in widths.items()}
    choice = next_cell(predictions, measured, 0.10, most)
    assert (choice.cell, choice.why) == (cell, why)


def test_a_cell_whose_step_may_split_is_never_chosen() -> None:
    """Its interval spans the slots the server assigns: measuring it narrows nothing."""
    split = dataclasses.replace(_p(100.0, 0.6), slot_passes=2)
    assert next_cell({(1, 2): split, (1, 1): _p(100.0, 0.3)}, 4, 0.10, 8).cell == (1, 1)
    assert next_cell({(1, 2): split}, 4, 0.10, 8).why == "done"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"plan": "half"}, "plan: 'half' is not one of full, sparse"),
        ({"plan": "sparse", "sparse_target": 0.0}, "sparse_target: 0.0 is not a fraction"),
        ({"plan": "sparse", "sparse_target": 1.5}, "sparse_target: 1.5 is not a fraction"),
        ({"sparse_max_cells": -1}, "sparse_max_cells: -1 is not 0"),
        ({"plan": "sparse", "request_rates": [1.0]}, "plan: sparse predicts closed-loop cells"),
        ({"plan": "sparse", "search": "concurrency"}, "not with search"),
        ({"plan": "sparse", "repetitions": 2}, "not with repetitions"),
        ({"plan": "sparse", "sessions": 3}, "not with sessions"),
    ],
)
def test_a_bad_plan_is_one_message_naming_the_field(fields, message) -> None:
    problems = Matrix(**fields).problems()
    assert any(message in p for p in problems), problems


def test_the_plan_fields_read_back_and_default_to_full() -> None:
    m = Matrix(plan="Sparse", sparse_target="5%", sparse_max_cells=6)
    assert (m.plan, m.sparse_target, m.sparse_max_cells) == ("sparse", 0.05, 6)
    assert Matrix.from_dict(m.to_dict()).plan == "sparse"
    assert Matrix().plan == "full" and Matrix().problems() == []


def _args(*flags: str):
    return build_parser().parse_args(["run", "--url", "http://127.0.0.1:9", *flags])


def test_the_run_flags_set_the_plan_fields() -> None:
    m = matrix_from_args(
        _args("--plan", "sparse", "--sparse-target", "8%", "--sparse-max-cells", "5")
    )
    assert (m.plan, m.sparse_target, m.sparse_max_cells) == ("sparse", 0.08, 5)
    assert matrix_from_args(_args()).plan == "full"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--plan", "sparse", "--sparse-target", "tight"), "--sparse-target: 'tight'"),
        (("--plan", "sparse", "--sparse-max-cells", "0"), "--sparse-max-cells: 0"),
        (("--plan", "sparse", "--request-rate", "2"), "plan: sparse predicts closed-loop"),
    ],
)
def test_a_bad_plan_flag_is_one_line(flags, message) -> None:
    with pytest.raises(UsageError, match=message):
        matrix_from_args(_args(*flags))
