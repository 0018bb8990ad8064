"""The CLI teaches: every option of every command has help, `run` is grouped with defaults and
examples, --meta, --prefill-contexts none, `init`, `run --dry-run` (no generation request,
an estimate close to the real run's time), no empty --out left behind, fast --help."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import speedmatrix
from cliproc import CLI
from speedmatrix import cli
from speedmatrix.cli import run as cli_run
from speedmatrix.matrix import Matrix

# the folder holding the speedmatrix under test (the installed package in CI, the
# source tree in a developer's in-place build), for the CLI run as a subprocess
PY = str(Path(speedmatrix.__file__).resolve().parents[1])


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_option_of_every_command_has_help():
    parser = cli.build_parser()
    commands = dict(_subparsers(parser))
    assert {"run", "init", "sim", "demo", "report", "compare"} <= set(commands)
    missing = []
    for name, p in [("speedmatrix", parser), *commands.items()]:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
        assert p.epilog or name == "speedmatrix" and parser.epilog, f"{name} has no examples"
    assert missing == []


def test_the_walk_can_fail():
    p = cli._Parser(prog="x")
    p.add_argument("--undocumented")
    assert not any((a.help or "").strip() for a in p._actions if a.dest == "undocumented")


def test_run_help_is_grouped_with_defaults_and_examples():
    run = dict(_subparsers(cli.build_parser()))["run"]
    text = run.format_help()
    for group in ("target:", "matrix:", "load:", "capacity overrides:", "report metadata:"):
        assert f"\n{group}\n" in text, group
    flat = " ".join(text.split())
    assert "(default: 30s)" in flat and "(default: 4096)" in flat
    assert "(default: completions)" in flat
    assert "examples:\n  # measure a server" in text
    assert "--dry-run" in text and "--meta KEY=VALUE" in text
    # report metadata is one group, not mixed with the load flags
    meta = text[text.index("report metadata:") : text.index("output:")]
    assert "--gpu" in meta and "--duration" not in meta


def test_groups_are_open_to_new_options():
    p = cli._Parser(prog="run")
    groups = cli.add_run_groups(p)
    groups["load"].add_argument("--request-rate", help="requests per second")
    assert "--request-rate" in p.format_help().split("load:")[1].split("capacity")[0]


def _args(*argv):
    return cli.build_parser().parse_args(["run", *argv])


def test_the_defaults_the_help_shows_are_the_matrix_defaults():
    from speedmatrix.units import format_duration, format_tokens

    m = Matrix()
    assert cli.RUN_DEFAULTS == {
        "contexts": ",".join(format_tokens(c) for c in m.contexts),
        "concurrency": ",".join(str(n) for n in m.concurrency),
        "duration": format_duration(m.duration_s),
        "max_output": str(m.max_output),
        "api": m.api,
        "repetitions": str(m.repetitions),
    }


def test_prefill_contexts_none_drops_the_presets_prefill():
    m = cli_run.matrix_from_args(_args("--preset", "seed", "--prefill-contexts", "none"))
    assert m.prefill_contexts == [] and m.contexts == Matrix.preset("seed").contexts


def test_meta_fills_the_flags_and_the_flag_wins():
    a = _args("--meta", "gpu=H200 NVL", "--meta", "vram=141 GB", "--gpu", "B200")
    cli_run.apply_meta(a)
    assert a.gpu == "B200" and a.vram == "141 GB"
    a = _args("--meta", "launch-command=sglang serve --tp 2")
    cli_run.apply_meta(a)
    assert a.launch_command == "sglang serve --tp 2"
    for bad in ("gpu", "colour=red"):
        with pytest.raises(cli.UsageError):
            cli_run.apply_meta(_args("--meta", bad))


def test_init_writes_a_commented_matrix_that_reads_back(tmp_path):
    path = tmp_path / "matrix.toml"
    assert cli.main(["init", str(path)]) == 0
    text = path.read_text()
    assert text.count("\n# ") >= 10 and "[matrix]" in text
    assert Matrix.from_toml(path) == Matrix.preset("seed")
    assert cli.main(["init", str(path)]) == cli.EXIT_USAGE  # never overwrites silently
    assert cli.main(["init", "--force", "--preset", "quick", str(path)]) == 0
    assert Matrix.from_toml(path) == Matrix.preset("quick")


@pytest.mark.e2e  # the CLI in a subprocess
def test_a_run_that_cannot_start_leaves_no_empty_out(tmp_path):
    out = tmp_path / "never"
    res = subprocess.run(
        CLI + ["run", "--url", "http://127.0.0.1:9", "--out", str(out), "--quiet"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": PY},
    )
    assert res.returncode != 0 and "error" in res.stderr
    assert not out.exists()


def test_help_is_fast():
    """`speedmatrix --help` imports no pandas/numpy/matplotlib (the budget is 0.5 s)."""
    code = (
        "import sys, time; t=time.perf_counter(); from speedmatrix import cli; "
        "p=cli.build_parser(); p.format_help(); "
        "[s.format_help() for a in p._actions if hasattr(a, 'choices') and "
        "isinstance(a.choices, dict) for s in a.choices.values()]; "
        "print(sorted(m for m in ('numpy','pandas','matplotlib','scipy','pyarrow') "
        "if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": PY},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


# ---------------------------------------------------------------- against the built-in engine
@pytest.fixture(scope="module")
def sim():
    from speedmatrix.sim import Sim

    with Sim("seed-h200") as s:
        yield s


def _requests_total(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    m = re.search(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return float(m.group(1))


@pytest.mark.e2e  # the built-in engine in real time
def test_dry_run_sends_no_generation_request_and_estimates_the_run(sim, tmp_path):
    out = tmp_path / "run"
    argv = [
        "run",
        "--url",
        sim.url,
        "--contexts",
        "4k,16k",
        "--concurrency",
        "1,4",
        "--prefill-contexts",
        "4k,32k",
        "--duration",
        "2s",
        "--max-output",
        "256",
        "--out",
        str(out),
        "--quiet",
        "--no-report",
    ]
    env = {**os.environ, "PYTHONPATH": PY}
    before = _requests_total(sim.url)
    dry = subprocess.run(
        CLI + argv + ["--dry-run"], check=False, capture_output=True, text=True, timeout=60, env=env
    )
    assert dry.returncode == 0, dry.stderr
    assert _requests_total(sim.url) == before  # discovery only
    assert not out.exists()
    text = dry.stdout
    assert "decode 16K × 4" in text and "Prompts: token_ids" in text
    assert "No generation request was sent" in text
    est = re.search(r"Estimated duration: (?:(\d+)m)?(\d+)s", text)
    est_s = int(est.group(1) or 0) * 60 + int(est.group(2))

    t0 = time.monotonic()
    res = subprocess.run(
        CLI + argv, check=False, capture_output=True, text=True, timeout=300, env=env
    )
    real_s = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert _requests_total(sim.url) > before
    cells = json.loads((out / "run.json").read_text())["cells"]
    assert len(cells) == 6
    assert (out / "cells.csv").is_file()  # exports come even with --no-report
    assert abs(est_s - real_s) <= 0.25 * real_s, (est_s, real_s)


@pytest.mark.e2e  # the CLI in a subprocess against the built-in engine
def test_dry_run_shows_cells_that_will_not_run(sim):
    res = subprocess.run(
        CLI + ["run", "--url", sim.url, "--preset", "seed", "--out", "/nonexistent/x", "--dry-run"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": PY},
    )
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "over capacity" in ln]
    assert len(lines) == 11  # the seed's over-capacity set
    assert "decode 123K × 16" in res.stdout
