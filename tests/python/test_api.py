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
