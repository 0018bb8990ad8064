"""Every import the package, its notebooks and its tests make is declared in pyproject.toml:
the package's in ``dependencies``, the tests' and notebooks' in ``dependencies`` or the
``test`` extra, optional ones (inside ``try: ... except ImportError``) in some extra. A fresh
``pip install .[test]`` then has everything the test suite needs."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
#: import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml", "tomli_w": "tomli-w", "sklearn": "scikit-learn", "PIL": "pillow"}
#: pandas features that import an optional package behind the caller's back
IMPLICIT = {r"\.style\b": "jinja2", r"\.to_parquet\(|read_parquet\(": "pyarrow"}


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in reqs}

    extras = {k: names(v) for k, v in project.get("optional-dependencies", {}).items()}
    return names(project["dependencies"]), extras


def _imports(source: str) -> tuple[set[str], set[str]]:
    """(required, optional) top-level modules; optional = imported inside a try whose handlers
    catch ImportError/ModuleNotFoundError."""
    tree = ast.parse(source)
    optional_nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            caught = {getattr(h.type, "id", None) for h in node.handlers} | {
                getattr(e, "id", None)
                for h in node.handlers
                if isinstance(h.type, ast.Tuple)
                for e in h.type.elts
            }
            if caught & {"ImportError", "ModuleNotFoundError"}:
                for stmt in node.body:
                    for sub in ast.walk(stmt):
                        optional_nodes.add(id(sub))
    req, opt = set(), set()
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        for m in mods:
            (opt if id(node) in optional_nodes else req).add(m.split(".")[0])
    for pattern, mod in IMPLICIT.items():
        if re.search(pattern, source):
            req.add(mod)
    return req, opt


def _third_party(mods: set[str], local: set[str]) -> set[str]:
    return {
        DIST.get(m, m).lower().replace("_", "-")
        for m in mods
        if m not in sys.stdlib_module_names and m not in local and m != "speedmatrix"
    }


def _notebook_source(path: Path) -> str:
    nb = json.loads(path.read_text())
    lines = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            lines += [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def _scan(files: list[Path], read=lambda p: p.read_text()) -> tuple[dict, dict]:
    local = {p.stem for p in (ROOT / "tests" / "python").glob("*.py")}
    local |= {p.stem for p in (ROOT / "bench").glob("*.py")}
    local |= {p.stem for p in (ROOT / "tests" / "fuzz").glob("*.py")}
    req: dict[str, list[str]] = {}
    opt: dict[str, list[str]] = {}
    for f in files:
        r, o = _imports(read(f))
        for d in _third_party(r, local):
            req.setdefault(d, []).append(f.name)
        for d in _third_party(o - r, local):
            opt.setdefault(d, []).append(f.name)
    return req, opt


def test_the_package_declares_what_it_imports():
    deps, extras = _declared()
    req, opt = _scan(sorted((ROOT / "python" / "speedmatrix").rglob("*.py")))
    assert {d: f for d, f in req.items() if d not in deps} == {}
    in_extras = set().union(*extras.values())
    assert {d: f for d, f in opt.items() if d not in deps | in_extras} == {}


def test_tests_and_notebooks_declare_what_they_import():
    deps, extras = _declared()
    have = deps | extras.get("test", set())
    req, _ = _scan(sorted((ROOT / "tests" / "python").glob("*.py")))
    nb, _ = _scan(sorted((ROOT / "notebooks").glob("*.ipynb")), read=_notebook_source)
    assert "jinja2" in nb  # notebook 02 styles a frame: the check sees through pandas
    for d, f in {**req, **nb}.items():
        assert d in have, f"{d} (imported by {', '.join(sorted(set(f)))}) is not declared"


@pytest.mark.parametrize(
    "source,required,optional",
    [
        ("import numpy as np\nfrom scipy import stats", {"numpy", "scipy"}, set()),
        ("try:\n    import rich\nexcept ImportError:\n    rich = None", set(), {"rich"}),
        ("df.style.format('{:.1f}')", {"jinja2"}, set()),
        ("from . import x\nimport os", {"os"}, set()),
    ],
)
def test_the_scanner_sees_imports(source, required, optional):
    r, o = _imports(source)
    assert r == required and o == optional
