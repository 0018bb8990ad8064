"""``--client-threads`` travels CLI -> Matrix -> PlannedCell (-> CellSpec, the sweep) and
comes back as ``client_threads`` in the records and the cell (fast tier; the end-to-end
check that figures do not depend on it is test_client_threads.py)."""

from __future__ import annotations

import pytest
from speedmatrix.adapters import Target
from speedmatrix.cliargs import UsageError, parse_client_threads
from speedmatrix.matrix import Matrix
from speedmatrix.plan import plan
from speedmatrix.records import Records


@pytest.mark.parametrize(
    ("text", "want"), [("auto", 0), ("AUTO", 0), ("1", 1), (" 4 ", 4), ("64", 64)]
)
def test_the_flag_reads_auto_or_a_count(text, want):
    assert parse_client_threads(text) == want


@pytest.mark.parametrize("text", ["0", "-2", "two", ""])
def test_a_bad_flag_is_one_line_naming_it(text):
    with pytest.raises(UsageError, match="--client-threads"):
        parse_client_threads(text)


@pytest.mark.parametrize(
    ("value", "ok"), [(0, True), (1, True), (1024, True), (1025, False), (-1, False), (1.5, False)]
)
def test_the_matrix_checks_the_field(value, ok):
    errors = Matrix(client_threads=value).problems()
    assert (not any("client_threads" in e for e in errors)) == ok, errors


def test_every_planned_cell_carries_it():
    t = Target("http://h:1", engine="sglang", model="m")
    for name, value in {"kv_tokens": 1 << 30, "context_length": 1 << 17}.items():
        t.set_capacity(name, value, "probed")
    cells = plan(Matrix(contexts=[1024], concurrency=[1, 512], client_threads=3), t)
    assert [c.client_threads for c in cells if c.phase == "decode"] == [3, 3]
    assert {c.client_threads for c in plan(Matrix(contexts=[1024]), t)} == {0}


def test_records_saved_before_the_field_read_as_one_loop():
    old = Records.from_loaded({"requests": {}, "events": {}}, {"t0_ns": 1, "t1_ns": 2})
    assert old.client_threads == 1
    new = Records.from_loaded(
        {"requests": {}, "events": {}, "stamps": {"client_threads": 4, "window_start_ns": 1}}
    )
    assert new.client_threads == 4
    assert new.stamps()["client_threads"] == 4
