"""`speedmatrix selftest` and the roofline a run copies into run.json (docs/SCALE.md).
The cache and the table are fast-tier; one short real selftest against the built-in
engine is end-to-end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from speedmatrix import roofline

ROOT = Path(__file__).resolve().parents[2]

ROOF = {
    "host": "h1",
    "cpus": 4,
    "measured_at": "2026-12-05T09:00:00+00:00",
    "load_average": 0.5,
    "loops": [
        {
            "client_threads": 1,
            "requests_per_s": 15000.0,
            "events_per_s": 1400000.0,
            "tokens_per_s": 1400000.0,
            "lockstep_streams": 512,
            "lockstep_p99_delay_ms": 12.5,
        }
    ],
}


@pytest.mark.parametrize(
    ("cpus", "want"), [(1, [1, 2]), (2, [1, 2]), (4, [1, 2, 3]), (16, [1, 2, 4, 8, 15])]
)
def test_default_loops_reach_the_cores_minus_one(cpus, want):
    assert roofline.default_loops(cpus) == want


def test_the_roofline_is_kept_per_host(tmp_path, monkeypatch):
    monkeypatch.delenv("SPEEDMATRIX_SELFTEST_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert roofline.load_cached("h1") is None
    path = roofline.save(ROOF)
    assert path == tmp_path / "speedmatrix" / "selftest" / "h1.json"
    assert roofline.load_cached("h1") == ROOF
    assert roofline.load_cached("other") is None
    path.write_text("{not json")
    assert roofline.load_cached("h1") is None  # unreadable: as if never measured
    assert roofline.cache_path("a/b c").name == "a_b_c.json"


def test_a_run_copies_this_hosts_roofline(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDMATRIX_SELFTEST_DIR", str(tmp_path))
    assert roofline.roofline_for_run() is None
    roofline.save({**ROOF, "host": os.uname().nodename})
    assert roofline.roofline_for_run()["loops"] == ROOF["loops"]


def test_the_table_says_each_loop_count():
    text = roofline.format_table(ROOF)
    assert "h1 (4 CPUs" in text
    assert "15,000" in text and "1,400,000" in text and "12.50 ms (512 streams)" in text


@pytest.mark.e2e
def test_selftest_measures_and_keeps_the_roofline(tmp_path):
    # the package as this test process imports it (installed in CI, in place in development)
    env = {**os.environ, "SPEEDMATRIX_SELFTEST_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "speedmatrix.cli", "selftest", "--loops", "1,2"]
        + ["--duration", "0.5", "--streams", "32", "--json"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    roof = json.loads(out.stdout)
    assert [r["client_threads"] for r in roof["loops"]] == [1, 2]
    for r in roof["loops"]:
        assert r["requests_per_s"] > 100
        assert r["events_per_s"] > 1000
        assert r["lockstep_streams"] == 32
        assert 0 < r["lockstep_p99_delay_ms"] < 1000
    kept = tmp_path / roofline.cache_path(roof["host"]).name
    assert json.loads(kept.read_text()) == roof
