"""Hostile round three, the smaller items (issue 25): bounded messages, a stalled
calibration, silent waits before a cell, temp files left by kill -9, warnings, a run that
measured nothing, and the hostile inputs that ended in `internal error`."""

from __future__ import annotations

import json

import pytest
from cliproc import run_cli
from speedmatrix.adapters import ModelNotServedError, discover
from speedmatrix.errors import clip, some_of
from test_hostile import RawServer, _answer

MANY = [f"org-{i:05d}/model-with-a-long-name-{i:05d}" for i in range(10_000)]


def _models_server(names: list[str]) -> RawServer:
    body = json.dumps({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

    def handler(conn, request):
        if request.startswith(b"GET /v1/models"):
            conn.sendall(_answer("200 OK", body.encode(), {"Content-Type": "application/json"}))
        else:
            conn.sendall(_answer("404 Not Found", b'{"error": "no"}'))

    return RawServer(handler)


def test_clip_and_some_of_bound_text_from_outside():
    assert clip("a\n b\t c") == "a b c"
    long = clip("x" * 5000, 100)
    assert long.startswith("x" * 100) and long.endswith("(4,900 characters more)")
    assert some_of(["a", "b"]) == "a, b"
    text = some_of(MANY)
    assert len(text) < 400 and text.endswith("and 9,990 more")


def test_ten_thousand_model_names_are_not_echoed_whole(tmp_path):
    srv = _models_server(MANY)
    try:
        with pytest.raises(ModelNotServedError) as err:
            discover(srv.url, model="nope", timeout_s=5)
        msg = str(err.value)
        assert len(msg) < 500 and "and 9,990 more" in msg and "\n" not in msg
        target = discover(srv.url, timeout_s=5)  # several models: the warning is bounded too
        (warning,) = [w for w in target.warnings if "several models" in w]
        assert len(warning) < 500 and "and 9,990 more" in warning
        res = run_cli(
            "run", "--url", srv.url, "--model", "x" * 20_000, "--out", str(tmp_path / "run")
        )
        assert res.returncode == 1 and res.stderr.count("\n") == 1
        assert len(res.stderr) < 2_200, len(res.stderr)
    finally:
        srv.close()


def test_a_stalled_calibration_is_bounded_and_said(monkeypatch):
    import time

    from speedmatrix import prompts
    from speedmatrix.adapters.base import Target

    def handler(conn, request):
        if request.startswith(b"POST"):
            time.sleep(3)  # takes the request, never answers in time

    srv = RawServer(handler)
    monkeypatch.setattr(prompts, "CALIBRATION_TIMEOUT_S", 0.5)
    try:
        factory = prompts.PromptFactory(Target(url=srv.url, model="m"), 256)
        start = time.monotonic()
        with pytest.raises(prompts.PromptError) as err:
            factory.prompts(1)
        assert time.monotonic() - start < 2.5
        msg = str(err.value)
        assert "calibration" in msg and "got no answer within 0.5 s" in msg and "stalled" in msg
        assert "cannot reach" not in msg
    finally:
        srv.close()
