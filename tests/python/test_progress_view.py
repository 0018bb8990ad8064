"""The live view's logic without a terminal or a kernel (fast tier): what the running cell's
line says while the window's requests still prefill, and the notebook display that updates
one output in place instead of printing lines to stderr."""

from __future__ import annotations

import io

import pytest
from speedmatrix.progress import NotebookView, Progress


class _Runner:
    def __init__(self, **p):
        from speedmatrix._native import _core

        self.p = {
            "tokens": 0,
            "completed": 0,
            "errors": 0,
            "in_flight": 8,
            "first_tokens": 0,
            "window_start_ns": _core.now_ns() - 3_000_000_000,
            "warmup_total": 0,
            "warmup_done": 0,
            "metrics": {},
            **p,
        }

    def progress(self) -> dict:
        return self.p


@pytest.mark.parametrize(
    ("p", "shown"),
    [
        # the window opened before any first token (an unsteady ramp, a prefill cell)
        ({"tokens": 0, "first_tokens": 0}, "prefilling: 0 of 8 first tokens"),
        ({"tokens": 40, "first_tokens": 3}, "prefilling: 3 of 8 first tokens"),
        # every stream decoding: the rate
        ({"tokens": 600, "first_tokens": 8}, "200.0 tok/s"),
        # requests replaced after the first finished: the rate, not "9 of 8"
        ({"tokens": 900, "first_tokens": 9, "completed": 1}, "300.0 tok/s"),
        # a core that does not count first tokens: "0 tok/s" is still never shown
        ({"tokens": 0, "first_tokens": None}, "prefilling: 0 of 8 first tokens"),
        ({"tokens": 30, "first_tokens": None}, "10.0 tok/s"),
    ],
)
def test_the_window_line_says_prefilling_until_tokens_flow(p, shown):
    run = _Runner(**p)
    if p.get("first_tokens", 0) is None:
        del run.p["first_tokens"]
    prog = Progress(False)
    prog.start_cell(1, 2, "decode 8K x 8", 30.0, eta_s=60.0, runner=run, key=(8192, 8))
    text = prog.text()
    assert f"window 3/30s · {shown} · 8 in flight" in text, text
    assert " 0.0 tok/s" not in text


class _Handle:
    def __init__(self, log):
        self.log = log

    def update(self, obj, raw=False):
        assert raw
        self.log.append(obj["text/plain"])


def _display(log):
    def display(obj, raw=False, display_id=False):
        assert display_id is True and raw
        log.append(obj["text/plain"])
        return _Handle(log)

    return display


def test_a_notebook_gets_one_output_updated_in_place_and_nothing_on_stderr():
    log: list[str] = []
    err = io.StringIO()
    prog = Progress(True, stream=err, notebook=NotebookView(display=_display(log)))
    prog.grid.contexts, prog.grid.concurrency = [(8192, "8K")], [1, 8]
    prog.start_cell(1, 2, "decode 8K x 8", 30.0, eta_s=60.0, runner=_Runner(), key=(8192, 8))
    try:
        prog.refresh()  # what the display thread does four times a second
        assert "prefilling: 0 of 8 first tokens" in log[-1] and "ETA" in log[-1]
        assert "▶ …" in log[-1]  # the running cell marked in the grid
        cell = {"phase": "decode", "context": 8192, "concurrency": 8, "status": "valid"}
        prog.end_cell("1,234.5 tok/s", {**cell, "total_tok_s": 1234.5})
        assert "[1/2] decode 8K x 8: 1,234.5 tok/s" in log[-1]
        prog.message("plan: 8K x 16 skipped")
        assert log[-1].splitlines()[:2] == [
            "[1/2] decode 8K x 8: 1,234.5 tok/s",
            "plan: 8K x 16 skipped",
        ]
    finally:
        prog.close()
    assert "1,234.5" in log[-1] and "ETA" not in log[-1]  # the final grid, no running line
    assert err.getvalue() == ""  # not two stderr lines per cell


def test_outside_a_kernel_no_notebook_view_is_made(monkeypatch):
    import sys

    from speedmatrix import progress

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert progress.in_notebook() is False
    assert Progress(True, stream=io.StringIO()).notebook is None
