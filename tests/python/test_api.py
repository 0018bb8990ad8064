"""The package's public names: `__all__` lists exactly the lazily loaded exports, and
each one loads."""

from __future__ import annotations

import speedmatrix


def test_all_lists_exactly_the_exports():
    assert set(speedmatrix.__all__) == set(speedmatrix._EXPORTS) | {"__version__"}
    assert len(speedmatrix.__all__) == len(set(speedmatrix.__all__))


def test_every_export_loads():
    for name in speedmatrix._EXPORTS:
        assert getattr(speedmatrix, name) is not None, name
    assert sorted(dir(speedmatrix)) == sorted(speedmatrix.__all__)


def test_one_version_source():
    # pyproject.toml -> CMake -> _core.version -> speedmatrix.__version__
    import re
    from pathlib import Path

    from speedmatrix._native import _core

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    declared = re.search(r'^version = "([^"]+)"$', pyproject.read_text(), re.MULTILINE)
    assert declared is not None
    assert _core.version == declared.group(1) == speedmatrix.__version__


def test_run_is_typed_and_checks_its_arguments_before_anything(tmp_path):
    """`sm.run` names its keyword arguments (a typo is a TypeError at the call, not deep in
    the sweep), and a bad URL or matrix is a ValueError naming it before any folder is made
    or request sent."""
    import inspect
    import math

    sig = inspect.signature(speedmatrix.run)
    assert {"api_key", "model", "overrides", "info", "progress", "report", "target"} <= set(
        sig.parameters
    )
    assert all(p.kind != p.VAR_KEYWORD for p in sig.parameters.values())
    assert sig.return_annotation == "Run"
    m = speedmatrix.Matrix(contexts=[1024])
    out = tmp_path / "never"
    try:
        speedmatrix.run("http://127.0.0.1:9", m, out=out, progres=False)
    except TypeError as exc:
        assert "progres" in str(exc)
    else:
        raise AssertionError("a misspelt keyword was accepted")
    for url, message in (("ftp://h", "url must start with http"), ("http://", "no host")):
        try:
            speedmatrix.run(url, m, out=out)
        except ValueError as exc:
            assert message in str(exc)
        else:
            raise AssertionError(url)
    bad = speedmatrix.Matrix(contexts=[1024], duration_s=math.nan)
    try:
        speedmatrix.run("http://127.0.0.1:9", bad, out=out)
    except ValueError as exc:
        assert "duration_s: nan" in str(exc)
    else:
        raise AssertionError("a NaN window was accepted")
    try:
        speedmatrix.run("http://127.0.0.1:9", {"contexts": [1024]}, out=out)  # type: ignore[arg-type]
    except TypeError as exc:
        assert "speedmatrix.Matrix" in str(exc)
    else:
        raise AssertionError("a dict was taken for a Matrix")
    assert not out.exists()
