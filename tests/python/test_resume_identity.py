"""--resume continues only on the server the run measured (issue 25): the engine, its
version, the model and the limits are checked against the saved run; a change is refused in
one line naming it, or with --force recorded in the run's warnings."""

from __future__ import annotations

import json
import types

import pytest
from cliproc import free_port, run_cli
from speedmatrix.runmeta import server_changes

SAVED = {
    "engine": {"name": "sglang", "adapter": "sglang", "version": "0.4.1", "commit": None},
    "target": {"model": "m-8b"},
    "capacity": {
        "kv_tokens": {"value": 100000, "source": "probed"},
        "context_length": {"value": 32768, "source": "probed"},
        "max_running": {"value": None, "source": "missing"},
    },
}


def _target(engine=None, model="m-8b", **caps):
    eng = {**SAVED["engine"], **(engine or {})}
    values = {k: v["value"] for k, v in SAVED["capacity"].items()} | caps
    return types.SimpleNamespace(
        engine_meta=lambda: eng,
        model=model,
        capacity_meta=lambda: {k: {"value": v, "source": "probed"} for k, v in values.items()},
    )


@pytest.mark.parametrize(
    ("target", "changes"),
    [
        (_target(), []),
        (_target({"version": "0.4.2"}), ["engine version 0.4.1 -> 0.4.2"]),
        (
            _target({"name": "vllm", "adapter": "vllm"}),
            ["engine sglang -> vllm", "engine adapter sglang -> vllm"],
        ),
        (_target(model="m-70b"), ["model m-8b -> m-70b"]),
        (_target(kv_tokens=50000), ["kv_tokens 100000 -> 50000"]),
        (_target(context_length=8192, max_running=64), ["context_length 32768 -> 8192"]),
        # unknown now (metrics not readable): no evidence of a change
        (_target({"version": None}, kv_tokens=None), []),
        (_target({"commit": "abc"}), []),
    ],
)
def test_what_counts_as_another_server(target, changes):
    assert server_changes(SAVED, target) == changes


def test_a_long_value_is_shortened():
    long = "v" * 500
    (change,) = server_changes(SAVED, _target({"version": long}))
    assert len(change) < 100


@pytest.mark.e2e
def test_resume_on_a_restarted_server_with_other_settings_is_refused(tmp_path):
    from speedmatrix.sim import Sim

    out, port = tmp_path / "run", free_port()
    args = ["run", "--contexts", "64", "--concurrency", "1", "--duration", "1s"]
    with Sim("fixed", port=port) as sim:
        res = run_cli(*args, "--url", sim.url, "--out", str(out), "--quiet", timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "run.json").read_text())
    doc["cells"][-1]["status"] = "error"  # a cell for --resume to measure again
    (out / "run.json").write_text(json.dumps(doc))
    before = (out / "run.json").read_text()
    with Sim("fixed", port=port, overrides={"kv_tokens": 4000000}):
        res = run_cli("run", "--resume", str(out), "--quiet", timeout=120)
        assert res.returncode == 1
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("speedmatrix: error:")]
        assert len(errors) == 1, res.stderr
        assert "kv_tokens 16777216 -> 4000000" in res.stderr and "--force" in res.stderr
        assert (out / "run.json").read_text() == before  # nothing written
        res = run_cli("run", "--resume", str(out), "--force", "--quiet", timeout=120)
    assert res.returncode == 0, res.stderr
    after = json.loads((out / "run.json").read_text())
    assert any("kv_tokens 16777216 -> 4000000" in w for w in after["meta"]["warnings"])
    assert {c["status"] for c in after["cells"]} == {"valid"}
