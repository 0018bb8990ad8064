"""Loads the compiled core and locates the built-in engine binary.

Kept apart so that a missing build gives one clear message instead of an
ImportError deep inside another module.
"""

from __future__ import annotations

import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent

try:
    from speedmatrix import _core  # noqa: F401  (re-exported)
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "speedmatrix's compiled core (speedmatrix._core) is not built. Install the package with "
        "`pip install .` from the source tree (scripts/setup.sh installs the system libraries "
        "it needs first), or for development build in place with "
        "`cmake -S . -B build/dev -DSPEEDMATRIX_INPLACE=ON && cmake --build build/dev`."
        f" (import error: {exc})"
    ) from exc


def sim_binary() -> Path:
    """Path of the `speedmatrix-sim` executable shipped inside the package."""
    override = os.environ.get("SPEEDMATRIX_SIM_BINARY")
    path = Path(override) if override else _HERE / "_bin" / "speedmatrix-sim"
    if not path.is_file():
        raise FileNotFoundError(
            f"the built-in engine binary is missing at {path}; reinstall speedmatrix "
            "(`pip install .`) or build in place with -DSPEEDMATRIX_INPLACE=ON"
        )
    return path
