"""The command line: bad flags and unreachable targets give one clear line and a
non-zero exit before any work starts; --help and --version work; metadata flags reach
run.json and the report; `report` and `compare` on saved runs."""

from __future__ import annotations

import json

import pytest
import synthetic
from cliproc import free_port as _free_port
from cliproc import run_cli as _cli
from cliproc import run_main as _main


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            [
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--contexts",
                "8x",
                "--concurrency",
                "1",
                "--out",
                "o",
            ],
            "8x",
        ),
        (
            [
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--contexts",
                "8k",
                "--concurrency",
                "0",
                "--out",
                "o",
            ],
            "concurrency",
        ),
        (
            [
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--contexts",
                "8k",
                "--concurrency",
                "1,two",
                "--out",
                "o",
            ],
            "two",
        ),
        (
            [
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--contexts",
                "8k",
                "--duration",
                "5parsecs",
                "--out",
                "o",
            ],
            "5parsecs",
        ),
        (["run", "--contexts", "8k", "--out", "o"], "--url"),
        (["run", "--url", "http://127.0.0.1:9", "--contexts", "8k"], "--out"),
        (["run", "--url", "http://127.0.0.1:9", "--bogus-flag"], "--bogus-flag"),
        (["run", "--url", "http://127.0.0.1:9", "--api", "grpc", "--out", "o"], "grpc"),
        (
            ["run", "--url", "http://127.0.0.1:9", "--extra-body", "{not json", "--out", "o"],
            "extra-body",
        ),
        (["report", "/nonexistent/run"], "run.json"),
    ],
)
def test_bad_flags_give_one_line_and_exit_2(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "--out o" is tmp_path / "o"
    # one as a whole process (its exit status, nothing else on stderr); the rest in this
    # process, which spares the interpreter's start-up and heavy imports each time
    res = (_cli if "--bogus-flag" in args else _main)(*args)
    assert res.returncode == 2, res
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("speedmatrix: error:")
    assert needle in lines[0]
    assert not (tmp_path / "o").exists()


def test_unreachable_server_is_one_line_and_exit_1(tmp_path):
    port = _free_port()  # nothing listens there
    out = tmp_path / "run"
    res = _cli(
        "run",
        "--url",
        f"http://127.0.0.1:{port}",
        "--contexts",
        "1k",
        "--concurrency",
        "1",
        "--duration",
        "1s",
        "--out",
        str(out),
    )
    assert res.returncode == 1, res
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert f"127.0.0.1:{port}" in lines[0]
    assert "refused" in lines[0] or "reach" in lines[0]


def test_version_and_help():
    res = _cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("speedmatrix ")
    res = _cli("run", "--help")
    assert res.returncode == 0
    for flag in (
        "--contexts",
        "--concurrency",
        "--prefill-contexts",
        "--duration",
        "--max-output",
        "--api-key",
        "--out",
        "--resume",
        "--kv-capacity",
    ):
        assert flag in res.stdout


# ---- metadata flags, and the report / compare commands on saved runs ----------------------
META_FLAGS = {
    "--model-name": "Muse-Glimmer-30B",
    "--engine": "sglang-fork",
    "--engine-version": "9.9.9",
    "--engine-commit": "abcdef123456",
    "--backend": "rocm",
    "--build": "rocm-6.4",
    "--repository": "github.com/me/sglang-fork",
    "--quantization": "FP8",
    "--os": "plan9",
    "--gpu": "MI300X",
    "--vram": "192 GB",
    "--hardware-type": "Discrete GPU",
    "--revision": "r42",
}


@pytest.mark.e2e  # a sweep against the built-in engine in real time
def test_metadata_flags_reach_run_json_and_the_report(tmp_path):
    from speedmatrix.sim import Sim

    out = tmp_path / "run"
    flags = [x for kv in META_FLAGS.items() for x in kv]
    with Sim("fixed") as sim:
        res = _cli(
            "run",
            "--url",
            sim.url,
            "--contexts",
            "64",
            "--concurrency",
            "1",
            "--duration",
            "1s",
            "--max-output",
            "50",
            "--prefill-contexts",
            "64",
            "--out",
            str(out),
            "--quiet",
            *flags,
            timeout=120,
        )
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "run.json").read_text())["meta"]
    t, e, hw = meta["target"], meta["engine"], meta["hardware"]
    assert (t["model_name"], t["model_name_source"]) == ("Muse-Glimmer-30B", "given")
    assert t["model_path"]  # still the probed path beside the given name
    assert (
        e["name"],
        e["version"],
        e["commit"],
        e["backend"],
        e["build"],
        e["repository"],
        e["quantization"],
    ) == (
        "sglang-fork",
        "9.9.9",
        "abcdef123456",
        "rocm",
        "rocm-6.4",
        "github.com/me/sglang-fork",
        "FP8",
    )
    assert e["adapter"] in ("sglang", "vllm") and e["simulated"] is True
    for key in ("name", "version", "commit", "backend", "build", "repository", "quantization"):
        assert e["sources"][key] == "given", key
    assert (hw["os"], hw["gpu"], hw["vram_gb"], hw["type"]) == (
        "plan9",
        "MI300X",
        192,
        "Discrete GPU",
    )
    assert all(hw["sources"][k] == "given" for k in ("os", "gpu", "vram_gb", "type"))
    assert meta["run"]["revision"] == "r42"
    md = (out / "report.md").read_text()
    assert "**Muse-Glimmer-30B on MI300X 192GB**" in md
    assert "sglang-fork (simulated by speedmatrix-sim) · 9.9.9 · FP8" in md
    for item in (
        "- **Commit:** abcdef123456",
        "- **Backend:** rocm",
        "- **Build:** rocm-6.4",
        "- **Repository:** github.com/me/sglang-fork",
        "- **OS:** plan9",
        "- **Revision:** r42",
        "| Engine | Build | rocm-6.4 | Given by the user |",
        "| Hardware | OS | plan9 | Given by the user |",
        "| Model | Name | Muse-Glimmer-30B | Given by the user |",
    ):
        assert item in md, item


@pytest.mark.e2e  # the CLI in a subprocess writing whole reports
def test_report_command_writes_the_report_of_a_saved_run(tmp_path):
    d = tmp_path / "run"
    synthetic.build_run(
        d, contexts=(8192,), concurrency=(1, 2), prefill_contexts=(8192,), duration_s=2.0
    )
    res = _cli("report", str(d))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["wrote", str(d / "report.md"), "wrote", str(d / "report.html")]
    md = (d / "report.md").read_text()
    assert md.startswith("# Speed test matrix\n") and "Muse-Glimmer-30B on H200 NVL 141GB" in md
    assert "| 8K |" in md and (d / "report.html").read_text().count("<svg") >= 3
    assert (d / "plots" / "decode_heatmap.svg").is_file()


@pytest.mark.e2e  # the CLI in a subprocess writing whole reports
def test_compare_command_keeps_its_charts_apart_from_the_runs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    kw = {
        "contexts": (8192,),
        "concurrency": (1, 2),
        "prefill_contexts": (8192,),
        "duration_s": 2.0,
    }
    synthetic.build_run(a, **kw)
    synthetic.build_run(b, speed=1.2, seed=3, engine_version="0.5.7", **kw)
    assert _cli("report", str(b)).returncode == 0
    own = {p.name: p.read_bytes() for p in (b / "plots").iterdir()}
    res = _cli("compare", str(a), str(b))
    assert res.returncode == 0, res.stderr
    written = [ln.removeprefix("wrote ") for ln in res.stdout.splitlines()]
    assert written == [str(b / "compare" / "compare.md"), str(b / "compare" / "compare.html")]
    md = (b / "compare" / "compare.md").read_text()
    assert "0.5.7" in md and "(plots/ratio_heatmap.svg)" in md
    assert (b / "compare" / "plots" / "ratio_heatmap.svg").is_file()
    assert {p.name: p.read_bytes() for p in (b / "plots").iterdir()} == own  # run B's untouched
    out = tmp_path / "elsewhere"
    assert _cli("compare", str(a), str(b), "--out", str(out)).returncode == 0
    assert (out / "compare.html").is_file() and (out / "plots" / "total_overlay.svg").is_file()
