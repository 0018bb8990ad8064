"""Every notebook in notebooks/ runs top to bottom without a cell error.

02 and 03 run on synthetic saved runs (tests/python/synthetic.py); 01 starts the built-in
engine and runs a small matrix (marked slow: about half a minute)."""

import os
import shutil
from pathlib import Path

import nbformat
import pytest
import speedmatrix
import synthetic

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def _execute(name, workdir, env):
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    old = dict(os.environ)
    os.environ.update(env)
    # the kernel runs in workdir: let it import the same speedmatrix as this process (the
    # installed package, or the source tree when PYTHONPATH points there)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(speedmatrix.__file__).resolve().parents[1])]
        + [str(Path(p).resolve()) for p in old.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend shows the charts
    try:
        NotebookClient(
            nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    return nb


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "01_quickstart.ipynb",
        "02_explore_saved_run.ipynb",
        "03_compare_runs.ipynb",
    ]
    for p in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(p, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), p.name


@pytest.mark.e2e  # a Jupyter kernel runs the notebook
def test_explore_saved_run(tmp_path):
    run_dir = _copy(synthetic.shared_run("full"), tmp_path / "run")
    nb = _execute("02_explore_saved_run.ipynb", tmp_path, {"SPEEDMATRIX_RUN_DIR": str(run_dir)})
    assert (run_dir / "report.html").is_file()
    html = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(html) >= 5  # the charts were drawn


@pytest.mark.e2e  # a Jupyter kernel runs the notebook
def test_compare_runs(tmp_path):
    a = _copy(synthetic.shared_run("full"), tmp_path / "a")
    b = _copy(synthetic.shared_run("faster"), tmp_path / "b")
    nb = _execute(
        "03_compare_runs.ipynb",
        tmp_path,
        {"SPEEDMATRIX_RUN_A": str(a), "SPEEDMATRIX_RUN_B": str(b)},
    )
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "# Speed test matrix comparison" in text
    assert (
        sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])) == 2
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_quickstart_against_the_built_in_engine(tmp_path):
    try:
        from speedmatrix import _native

        _native.sim_binary()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"the compiled core or the built-in engine is not built: {exc}")
    out = tmp_path / "quick"
    _execute("01_quickstart.ipynb", tmp_path, {"SPEEDMATRIX_QUICKSTART_OUT": str(out)})
    assert (out / "run.json").is_file() and (out / "report.html").is_file()
