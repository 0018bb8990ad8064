"""Fixtures shared by the test files (helpers they import live in synthetic.py, seed.py and
cliproc.py)."""

from __future__ import annotations

import os
import tempfile

import pytest

# Runs started by the tests (and their subprocesses) never read this host's own
# `speedmatrix selftest` roofline: a cell's client_headroom and client_near_limit would
# then depend on whether someone ran it here. Tests that want one write it here.
os.environ["SPEEDMATRIX_SELFTEST_DIR"] = tempfile.mkdtemp(prefix="speedmatrix-selftest-")


@pytest.fixture(scope="module")
def fixed_sim():
    """The built-in engine with the `fixed` profile, one per test module."""
    from speedmatrix.sim import Sim

    with Sim("fixed") as s:
        yield s
