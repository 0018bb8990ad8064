"""Every input the discovery fuzzer (tests/fuzz/fuzz_discovery.py) ever broke discover()
with is kept in tests/fuzz/regressions/discovery/ and replayed here: each must now end in a
Target or a SpeedmatrixError (the C++ targets' inputs are replayed by ctest -R fuzz)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))
import fuzz_discovery

INPUTS = sorted((FUZZ / "regressions" / "discovery").glob("*.json"))


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_kept_discovery_input(path, monkeypatch):
    from speedmatrix import http

    monkeypatch.setattr(http.HttpClient, "request", http.HttpClient.request)  # undone after
    trace = fuzz_discovery.run_one(json.loads(path.read_text())["routes"])
    assert trace is None, trace
