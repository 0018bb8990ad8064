"""Fixtures shared by the test files (helpers they import live in synthetic.py, seed.py and
cliproc.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def fixed_sim():
    """The built-in engine with the `fixed` profile, one per test module."""
    from speedmatrix.sim import Sim

    with Sim("fixed") as s:
        yield s
