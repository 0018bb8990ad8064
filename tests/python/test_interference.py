"""The prefill-interference figures through the core's binding, on synthetic arrivals: fast tier."""

from __future__ import annotations

import math

from speedmatrix import _core

MS = 1_000_000


def _decoder(start_ns: int, end_ns: int, tbt_ns: int, stall_ns: int, windows) -> list[int]:
    """Tokens every tbt_ns, every stall_ns while a prefill window meets the next gap."""
    t = [start_ns]
    while t[-1] < end_ns:
        a = t[-1]
        hit = any(a < e and s < a + tbt_ns for s, e in windows)
        t.append(a + (stall_ns if hit else tbt_ns))
    return t


def test_inflation_is_the_stall_over_the_steady_gap():
    windows = [(500 * MS, 650 * MS), (1_200 * MS, 1_330 * MS)]
    streams = [_decoder(i * 7 * MS, 2_000 * MS, 25 * MS, 125 * MS, windows) for i in range(3)]
    f = _core.interference_figures(streams, windows)
    assert f["overlap_gaps"] > 0 and f["clear_gaps"] > f["overlap_gaps"]
    assert math.isclose(f["p99_tbt_overlap_ms"], 125.0)
    assert math.isclose(f["p99_tbt_clear_ms"], 25.0)
    assert math.isclose(f["tbt_inflation"], 5.0)
    assert f["gaps_over_long"] == f["overlap_gaps"]  # every stall is over 100 ms


def test_without_prefills_the_inflation_is_undefined():
    f = _core.interference_figures([[0, 10 * MS, 20 * MS]], [])
    assert f["overlap_gaps"] == 0 and f["clear_gaps"] == 2
    assert math.isnan(f["tbt_inflation"])
