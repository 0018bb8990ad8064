"""The house rules of python/speedmatrix, checked from the source: no import circle, no
upward import (the report above results, results above adapters), no private name used
across modules, and no file over ~500 lines without its reason at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import speedmatrix

PACKAGE = Path(speedmatrix.__file__).parent
MAX_LINES = 520


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, top_level_only: bool):
    """(module imported, names imported) of speedmatrix imports in `path`."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("speedmatrix"):
                yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("speedmatrix"):
                    yield a.name, []


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for target, names in _imports(path, top_level_only=True):
            for name in names:  # `from speedmatrix import runfile` imports a module
                if f"{target}.{name}" in mods:
                    graph[mod].add(f"{target}.{name}")
            if target in mods and target != mod:
                graph[mod].add(target)
    return graph


def test_no_import_circle():
    mods = _modules()
    graph = _graph(mods)
    # a package's __init__ imports its submodules: that edge is not a circle
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if n.startswith(m + "."):
                continue
            if state.get(n) == 1:
                cycle = stack[stack.index(n) :] + [n] if n in stack else [m, n]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_upward_imports():
    below_report = (
        "speedmatrix.results",
        "speedmatrix.records",
        "speedmatrix.verdict",
        "speedmatrix.runfile",
        "speedmatrix.adapters",
        "speedmatrix.units",
        "speedmatrix.naming",
    )
    for mod, path in _modules().items():
        if not mod.startswith(below_report):
            continue
        for target, _names in _imports(path, top_level_only=False):
            assert not target.startswith("speedmatrix.report"), f"{mod} imports {target}"
            if mod.startswith(("speedmatrix.adapters", "speedmatrix.verdict")):
                assert not target.startswith(("speedmatrix.sweep", "speedmatrix.results"))


def test_no_private_names_across_modules():
    for mod, path in _modules().items():
        for target, names in _imports(path, top_level_only=False):
            private = [
                n
                for n in names
                if n.startswith("_") and not n.startswith("__") and n not in ("_core", "_native")
            ]
            assert not private, f"{mod} imports {private} from {target}"


def test_long_files_say_why():
    for mod, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_LINES:
            head = text[:4000]
            assert "Over 500 lines" in head, f"{mod}: {text.count(chr(10))} lines, no reason"
