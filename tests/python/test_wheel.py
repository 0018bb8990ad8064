"""The wheel installs without a compiler or system libraries: it is installed into a fresh
venv, runs one cell against the built-in engine started from the wheel, and its extension and
engine load nothing from outside the wheel but what the manylinux policy allows.

Slow (a wheel build is minutes; a fresh venv downloads the dependencies): marker ``e2e``.
``$SPEEDMATRIX_WHEEL`` names a wheel already built by scripts/build-wheel.sh (scripts/test.sh
builds one first); without it the test builds one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1500
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 120


def _sh(cmd, timeout, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    assert res.returncode == 0, f"{cmd}: {res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("SPEEDMATRIX_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("dist")
    _sh(["bash", str(ROOT / "scripts" / "build-wheel.sh"), str(out)], BUILD_TIMEOUT_S)
    return next(out.glob("speedmatrix-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    _sh([sys.executable, "-m", "venv", str(env_dir)], 120)  # no system site-packages
    _sh([str(env_dir / "bin" / "pip"), "install", "--quiet", str(wheel)], INSTALL_TIMEOUT_S)
    return env_dir


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _policy_whitelist(wheel: Path) -> set[str]:
    tools = ROOT / "build" / "wheel-tools" / "bin" / "python"  # has auditwheel
    code = (
        "import runpy, sys, json; from pathlib import Path; "
        "m = runpy.run_path(sys.argv[1]); "
        "print(json.dumps(sorted(m['policy_whitelist'](Path(sys.argv[2])))))"
    )
    out = _sh(
        [
            str(tools if tools.exists() else sys.executable),
            "-c",
            code,
            str(ROOT / "scripts" / "wheel_bundle_exe.py"),
            str(wheel),
        ],
        60,
    )
    return set(json.loads(out))


def test_wheel_is_manylinux_and_carries_its_libraries(wheel):
    assert re.search(r"manylinux_\d+_\d+_x86_64", wheel.name), wheel.name
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    libs = [n for n in names if n.startswith("speedmatrix.libs/")]
    assert any("libcurl" in n for n in libs), libs
    assert "speedmatrix/_bin/speedmatrix-sim" in names
    assert any(n.startswith("speedmatrix/_core") and n.endswith(".so") for n in names)
    assert "speedmatrix/schemas/run-1.schema.json" in names
    assert "speedmatrix/report/templates/page.html.j2" in names


def test_extension_and_engine_need_nothing_outside_the_wheel(wheel, venv):
    site = _site(venv)
    allowed = _policy_whitelist(wheel)
    core = next((site / "speedmatrix").glob("_core*.so"))
    sim = site / "speedmatrix" / "_bin" / "speedmatrix-sim"
    for binary in (core, sim):
        out = _sh(["ldd", str(binary)], 30)
        assert "not found" not in out, out
        for line in out.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if not m or m.group(1) in allowed or m.group(1).startswith("libpython"):
                continue
            assert m.group(2).startswith(str(site)), f"{binary.name}: {line.strip()}"


def test_one_cell_against_the_built_in_engine_from_the_wheel(venv, tmp_path):
    """The installed console script starts the wheel's engine and measures one cell."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import sys\n"
        "from speedmatrix.sim import Sim\n"
        "import subprocess\n"
        "with Sim('fixed') as s:\n"
        "    r = subprocess.run([sys.argv[1], 'run', '--url', s.url, '--contexts', '256',"
        " '--concurrency', '1', '--prefill-contexts', 'none', '--duration', '1s',"
        " '--max-output', '64', '--out', sys.argv[2], '--quiet'])\n"
        "    sys.exit(r.returncode)\n"
    )
    _sh(
        [str(venv / "bin" / "python"), "-c", code, str(venv / "bin" / "speedmatrix"), str(out)],
        RUN_TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )
    doc = json.loads((out / "run.json").read_text())
    (cell,) = doc["cells"]
    assert cell["status"] == "valid" and cell["total_tok_s"] > 0
    assert (out / "report.html").is_file() and (out / "cells.csv").is_file()
    assert (out / "requests.parquet").is_file()
