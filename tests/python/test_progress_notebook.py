"""In a real Jupyter kernel the sweep's view is one notebook output updated in place (the
finished cells' lines above the grid), not lines on stderr."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
import speedmatrix

pytestmark = pytest.mark.e2e  # a Jupyter kernel runs the cell

SOURCE = """
from speedmatrix.progress import Progress, in_notebook
p = Progress(True)
print("in notebook:", in_notebook(), p.notebook is not None)
p.grid.contexts, p.grid.concurrency = [(1024, "1K")], [1, 8]
p.start_cell(1, 2, "decode 1K x 8", 1.0, eta_s=2.0, key=(1024, 8))
p.end_cell("1,234.5 tok/s", {"phase": "decode", "context": 1024, "concurrency": 8,
                              "status": "valid", "total_tok_s": 1234.5})
p.close()
"""


def test_the_view_is_one_updating_output_in_a_kernel(tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SOURCE)])
    old = dict(os.environ)
    os.environ["PYTHONPATH"] = str(Path(speedmatrix.__file__).resolve().parents[1])
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    outputs = nb.cells[0]["outputs"]
    assert not [o for o in outputs if o.get("output_type") == "error"], outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "in notebook: True True" in text
    assert "[1/2]" not in "".join(
        o.get("text", "") for o in outputs if o.get("name") == "stderr"
    )  # no lines on stderr
    shown = [o for o in outputs if o.get("output_type") == "display_data"]
    assert len(shown) == 1, outputs  # one output, updated in place
    final = shown[0]["data"]["text/plain"]
    assert final.startswith("[1/2] decode 1K x 8: 1,234.5 tok/s\n")
    assert re.search(r"1K\s+·\s+1,234\.5", final), final  # the grid, with the finished cell
