"""Loads the compiled core (and re-exports ``sim_binary``, the built-in engine's path, which
``speedmatrix.sim`` finds without the core).

Kept apart so that a missing build gives one clear message instead of an
ImportError deep inside another module.
"""

from __future__ import annotations

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

from speedmatrix.sim import sim_binary  # noqa: F401  (re-exported)
