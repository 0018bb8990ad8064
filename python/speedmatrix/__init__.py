"""speedmatrix: the speed test matrix of an OpenAI-compatible LLM server.

    import speedmatrix as sm
    with sm.Sim("seed-h200") as sim:                 # the built-in engine
        run = sm.run(sim.url, sm.Matrix.preset("quick"), out="out/quick")
    run.status_table("total_tok_s")                        # the seed's table as a DataFrame

The public names are loaded lazily so that `import speedmatrix` stays cheap and
the pure-Python parts work before the compiled core is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    __version__: str

_EXPORTS = {
    "Matrix": "speedmatrix.matrix",
    "discover": "speedmatrix.adapters",
    "register_adapter": "speedmatrix.adapters",
    "Target": "speedmatrix.adapters",
    "plan": "speedmatrix.plan",
    "run": "speedmatrix.sweep",
    "Sweep": "speedmatrix.sweep",
    "load": "speedmatrix.results",
    "concat": "speedmatrix.results",
    "Run": "speedmatrix.results",
    "Sim": "speedmatrix.sim",
    "write_report": "speedmatrix.report",
    "compare": "speedmatrix.report.compare",
    "fit": "speedmatrix.twin.fitrun",
    "predict": "speedmatrix.twin.predictrun",
}

# Spelled out for static tools; tests/python/test_api.py holds it to _EXPORTS.
__all__ = [
    "Matrix",
    "Run",
    "Sim",
    "Sweep",
    "Target",
    "__version__",
    "compare",
    "concat",
    "discover",
    "fit",
    "load",
    "plan",
    "predict",
    "register_adapter",
    "run",
    "write_report",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # One version source: pyproject.toml -> CMake -> _core.version -> here.
        from speedmatrix._native import _core  # start-up: `import speedmatrix` loads no core

        globals()[name] = _core.version
        return _core.version
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'speedmatrix' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)  # start-up: loaded on first use
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
