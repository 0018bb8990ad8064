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
