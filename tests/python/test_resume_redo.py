"""--resume measures again every saved cell that is not valid, queued or over capacity (the
cell running when the server died is saved as `error`; issue 14), and says which."""

from __future__ import annotations

import json

import pytest
from speedmatrix import runfile, sweep
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.matrix import Matrix


def _cell(cid: str, status: str, **extra) -> dict:
    return {
        "id": cid,
        "phase": "decode",
        "context": 64,
        "concurrency": 1,
        "status": status,
        "total_tok_s": None,
        "per_request_tok_s": None,
        "prompt_tok_s": None,
        "ttft_ms": None,
        "tbt_ms": None,
        "avg_active": None,
        "completed": 0,
        "output_tokens": 0,
        "measured_s": 0,
        "errors": {},
        **extra,
    }


CELLS = [
    (_cell("valid-1", "valid"), True),
    (_cell("queued-1", "queued"), True),
    (_cell("over-1", "over_capacity"), True),
    (_cell("error-1", "error", reason="server stopped answering"), False),
    (_cell("lost-1", "error", not_run="server unreachable"), False),
    (_cell("valid-but-not-run", "valid", not_run="server unreachable"), False),
]


@pytest.mark.parametrize("cell, kept", CELLS, ids=[c["id"] for c, _ in CELLS])
def test_which_saved_cells_resume_keeps(tmp_path, cell, kept):
    doc = {"schema": runfile.SCHEMA, "meta": {}, "cells": [cell]}
    s = sweep.Sweep("http://127.0.0.1:9", Matrix(), tmp_path, resume_doc=doc, progress=False)
    assert s._done(cell["id"]) is kept


def test_resume_says_which_cells_it_measures_again(tmp_path, capsys):
    doc = {
        "schema": runfile.SCHEMA,
        "meta": {
            "target": {"url": "http://127.0.0.1:9", "model": "m"},
            "run": {"matrix": Matrix().to_dict()},
        },
        "cells": [c for c, _ in CELLS],
    }
    (tmp_path / "run.json").write_text(json.dumps(doc))
    with pytest.raises(SpeedmatrixError):  # nothing listens on port 9: discovery fails after
        sweep.resume(tmp_path, progress=False, report=False)
    err = capsys.readouterr().err
    assert "measures again 3 cell(s)" in err
    for cid in ("error-1", "lost-1", "valid-but-not-run"):
        assert cid in err
    assert "valid-1" not in err and "queued-1" not in err
