"""Reports of a saved run: ``DIR/report.md`` and a self-contained ``DIR/report.html``.

from speedmatrix.report import write_report
md_path, html_path = write_report("out/seed")

The names are loaded on first use, so that importing one light part of the package (the
number formatting of the terminal, say) does not import pandas, Jinja2 and matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (loaded on first use: start-up time)
_LAZY = {
    "render_report": "speedmatrix.report.render",
    "write_report": "speedmatrix.report.render",
    "write_compare": "speedmatrix.report.compare",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)  # start-up: on first use
    raise AttributeError(name)


__all__ = ["render_report", "write_compare", "write_report"]
