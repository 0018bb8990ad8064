"""The wheel installs without a compiler or system libraries on glibc 2.28 and later: it is
installed into a fresh venv with no compiler on PATH, runs one cell against the built-in
engine started from the wheel, its extension and engine load nothing from outside the wheel
but what the manylinux policy allows, the newest glibc / libstdc++ symbol versions its ELF
files need are those of RHEL 8 (glibc 2.28, GCC 8), and auditwheel agrees (manylinux_2_28 or
lower).

Slow (a wheel build is minutes; a fresh venv downloads the dependencies): marker ``e2e``.
``$SPEEDMATRIX_WHEEL`` names a wheel already built by scripts/build-wheel.sh, or a folder of
them (one per CPython: the symbol and policy checks cover each; the install runs the one for
this interpreter); without it the test builds one.
The parser of ``readelf -V`` is checked on synthetic text in the fast tier.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1500
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 120
# RHEL 8 / Ubuntu 20.04 era: glibc 2.28; the oldest libstdc++ there is GCC 8's.
MAX_GLIBC = (2, 28)
MAX_GLIBCXX = (3, 4, 25)
MAX_CXXABI = (1, 3, 11)
ELF_MAGIC = b"\x7fELF"


def _sh(cmd, timeout, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    assert res.returncode == 0, f"{cmd}: {res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def required_versions(readelf_v: str) -> dict[str, set[tuple[int, ...]]]:
    """The symbol versions an ELF file needs, by family (GLIBC, GLIBCXX, CXXABI, GCC), from the
    "Version needs" section of ``readelf -V`` (the versions it defines are not needs)."""
    needs: dict[str, set[tuple[int, ...]]] = {}
    section = readelf_v.split("Version needs section", 1)
    if len(section) < 2:
        return needs
    for m in re.finditer(r"Name: ([A-Z]+)_([0-9][0-9.]*)\s", section[1]):
        needs.setdefault(m.group(1), set()).add(tuple(int(x) for x in m.group(2).split(".")))
    return needs


def auditwheel_tags(show: str) -> list[tuple[int, int]]:
    """The manylinux_X_Y tags `auditwheel show` says a wheel is consistent with."""
    return [(int(a), int(b)) for a, b in re.findall(r"manylinux_(\d+)_(\d+)_x86_64", show)]


READELF_SAMPLE = """
Version definitions section '.gnu.version_d' contains 2 entries:
  0x001c: Rev: 1  Flags: none  Index: 2  Cnt: 1  Name: GLIBC_2.99

Version needs section '.gnu.version_r' contains 2 entries:
  000000: Version: 1  File: libstdc++.so.6  Cnt: 2
  0x0010:   Name: GLIBCXX_3.4.29  Flags: none  Version: 10
  0x0020:   Name: CXXABI_1.3  Flags: none  Version: 7
  0x0030: Version: 1  File: libc.so.6  Cnt: 2
  0x0040:   Name: GLIBC_2.2.5  Flags: none  Version: 12
  0x0050:   Name: GLIBC_2.32  Flags: none  Version: 14
"""


@pytest.mark.parametrize(
    ("text", "family", "newest"),
    [
        (READELF_SAMPLE, "GLIBC", (2, 32)),  # 2.32 > 2.2.5 numerically, not as text
        (READELF_SAMPLE, "GLIBCXX", (3, 4, 29)),
        (READELF_SAMPLE, "CXXABI", (1, 3)),
        ("No version information found in this file.\n", "GLIBC", None),
    ],
)
def test_required_versions_reads_the_needs_not_the_definitions(text, family, newest):
    got = required_versions(text).get(family)
    assert (max(got) if got else None) == newest


def test_auditwheel_tags_reads_every_tag():
    show = (
        'is consistent with the following platform tag: "manylinux_2_17_x86_64".\n'
        'This constrains the platform tag to "manylinux_2_28_x86_64".'
    )
    assert auditwheel_tags(show) == [(2, 17), (2, 28)]
    assert auditwheel_tags("no tag") == []


def _this_python_tag() -> str:
    return f"cp{sys.version_info[0]}{sys.version_info[1]}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> list[Path]:
    given = os.environ.get("SPEEDMATRIX_WHEEL")
    if given:
        path = Path(given)
        found = sorted(path.glob("speedmatrix-*.whl")) if path.is_dir() else [path]
    else:
        out = tmp_path_factory.mktemp("dist")
        _sh(["bash", str(ROOT / "scripts" / "build-wheel.sh"), str(out)], BUILD_TIMEOUT_S)
        found = sorted(out.glob("speedmatrix-*.whl"))
    assert found, f"no wheel in {given}"
    return found


@pytest.fixture(scope="module")
def wheel(wheels) -> Path:
    mine = [w for w in wheels if f"-{_this_python_tag()}-" in w.name]
    assert mine, f"no {_this_python_tag()} wheel among {[w.name for w in wheels]}"
    return mine[0]


def _no_compiler_env(venv: Path) -> dict[str, str]:
    """The environment of a GPU node's user: the venv's bin on PATH, and no compiler anywhere
    on it, nor any PYTHONPATH pointing at a source tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CC", "CXX")}
    env["PATH"] = str(venv / "bin")
    for cc in ("cc", "gcc", "g++", "c++", "clang", "zig"):
        assert shutil.which(cc, path=env["PATH"]) is None, cc
    return env


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    _sh([sys.executable, "-m", "venv", str(env_dir)], 120)  # no system site-packages
    _sh(
        [str(env_dir / "bin" / "pip"), "install", "--quiet", str(wheel)],
        INSTALL_TIMEOUT_S,
        env=_no_compiler_env(env_dir),
    )
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


def _elf_files(wheel: Path, dest: Path) -> list[Path]:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest)
    return [p for p in dest.rglob("*") if p.is_file() and p.read_bytes()[:4] == ELF_MAGIC]


def _readelf(args: list[str], path: Path) -> str:
    return _sh(["readelf", "-W", *args, str(path)], 30)


@pytest.mark.e2e
@pytest.mark.slow
def test_wheel_is_manylinux_and_carries_its_libraries(wheels, tmp_path):
    """Every wheel: a manylinux tag, the extension, the engine, the package data, and every
    library its ELF files name (DT_NEEDED) either allowed from the system by the policy or
    shipped in speedmatrix.libs/ (libcurl, libevent, simdjson: linked in statically)."""
    for i, wheel in enumerate(wheels):
        assert re.search(r"manylinux_\d+_\d+_x86_64", wheel.name), wheel.name
        names = zipfile.ZipFile(wheel).namelist()
        assert "speedmatrix/_bin/speedmatrix-sim" in names
        assert any(n.startswith("speedmatrix/_core") and n.endswith(".so") for n in names)
        assert "speedmatrix/schemas/run-1.schema.json" in names
        assert "speedmatrix/report/templates/page.html.j2" in names
        # The dynamic loader is glibc's own (auditwheel's policies leave it out of the list).
        allowed = _policy_whitelist(wheel) | {"ld-linux-x86-64.so.2"}
        shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("speedmatrix.libs/")}
        for elf in _elf_files(wheel, tmp_path / str(i)):
            needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(["-d"], elf))
            outside = [n for n in needed if n not in allowed and n not in shipped]
            assert not outside, f"{wheel.name}: {elf.name} needs {outside} from the system"


@pytest.mark.e2e
@pytest.mark.slow
def test_wheel_needs_glibc_2_28_and_gcc_8_libstdcxx_at_most(wheels, tmp_path):
    """The newest symbol versions any ELF file in the wheel needs load on RHEL 8 / Ubuntu 20.04
    (glibc 2.28; libstdc++ of GCC 8, or none: zig links LLVM's libc++ in statically)."""
    limits = {"GLIBC": MAX_GLIBC, "GLIBCXX": MAX_GLIBCXX, "CXXABI": MAX_CXXABI}
    for i, wheel in enumerate(wheels):
        elves = _elf_files(wheel, tmp_path / str(i))
        assert any(e.name == "speedmatrix-sim" for e in elves)
        assert any(e.name.startswith("_core") for e in elves)
        for elf in elves:
            needs = required_versions(_readelf(["-V"], elf))
            assert "GLIBC" in needs, f"{elf.name}: no glibc symbol versions read"
            for family, limit in limits.items():
                newest = max(needs.get(family, {()}))
                assert newest <= limit, (
                    f"{wheel.name}: {elf.name} needs {family}_{newest} > {limit}"
                )


@pytest.mark.e2e
@pytest.mark.slow
def test_auditwheel_says_manylinux_2_28_or_lower(wheels):
    auditwheel = ROOT / "build" / "wheel-tools" / "bin" / "auditwheel"
    if not auditwheel.exists():
        pytest.skip("build/wheel-tools (scripts/build-wheel.sh makes it) has no auditwheel")
    for wheel in wheels:
        tags = auditwheel_tags(_sh([str(auditwheel), "show", str(wheel)], 60))
        assert tags and max(tags) <= MAX_GLIBC, f"{wheel.name}: auditwheel says {tags}"
        in_name = [(int(a), int(b)) for a, b in re.findall(r"manylinux_(\d+)_(\d+)", wheel.name)]
        assert in_name and max(in_name) <= MAX_GLIBC, wheel.name


@pytest.mark.e2e
@pytest.mark.slow
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


@pytest.mark.e2e
@pytest.mark.slow
def test_one_cell_against_the_built_in_engine_from_the_wheel(venv, tmp_path):
    """The installed console script starts the wheel's engine and measures one cell, with no
    compiler on PATH."""
    out = tmp_path / "run"
    env = _no_compiler_env(venv)
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
