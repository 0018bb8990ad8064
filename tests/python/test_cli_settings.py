"""Settings are never silently dropped (issue 21, "Settings and output"; issue 25, bounds):
every key `speedmatrix init` writes, edited, is read back; a key outside [matrix] or
unknown is an error that names it; NaN, infinity and values past their bound are refused
with a line naming the field."""

from __future__ import annotations

import math
import re

import pytest
from speedmatrix import cli
from speedmatrix.cli import run as cli_run
from speedmatrix.dryrun import commented_toml
from speedmatrix.matrix import Matrix

#: every field `init` writes, with a TOML value unlike every preset's and what it reads as
EDITS = {
    "contexts": ("[4096]", [4096]),
    "concurrency": ("[3]", [3]),
    "duration_s": ("12.5", 12.5),
    "max_output": ("100", 100),
    "prefill_contexts": ("[2048]", [2048]),
    "api": ('"chat"', "chat"),
    "shared_prefix": ("-512", -512),
    "repetitions": ("3", 3),
    "warmup": ("false", False),
    "idle_timeout_s": ("7.0", 7.0),
    "error_threshold": ("0.1", 0.1),
    "prefill_mode": ('"separate"', "separate"),
    "request_idle_timeout_s": ("33.0", 33.0),
    "prefill_cooldown_s": ("2.5", 2.5),
    "request_rates": ("[1.5]", [1.5]),
    "arrival": ('"constant"', "constant"),
    "max_concurrency": ("9", 9),
    "drain_timeout_s": ("11.0", 11.0),
    "percentiles": ("[50.0, 99.0]", [50.0, 99.0]),
    "slo": ("{ ttft = 2000.0 }", {"ttft": 2000.0}),
    "attainment": ("0.9", 0.9),
    "search": ('"rate"', "rate"),
    "prompts_file": ('"w.jsonl"', "w.jsonl"),
    "precision": ("0.02", 0.02),
    "min_duration_s": ("6.0", 6.0),
    "stall_min_s": ("3.0", 3.0),
    "stall_gap_factor": ("30.0", 30.0),
    "ramp_cap_s": ("90.0", 90.0),
    "client_threads": ("2", 2),
    "cached_fraction": ("[0.0, 0.5]", [0.0, 0.5]),
    "interference_every_s": ("2.0", 2.0),
    "trace": ('"t.jsonl"', "t.jsonl"),
    "speedup": ("4.0", 4.0),
    "sessions": ("3", 3),
    "turn_tokens": ("128", 128),
    "think_time_s": ("1.5", 1.5),
    "plan": ('"sparse"', "sparse"),
    "sparse_target": ("0.05", 0.05),
    "sparse_max_cells": ("6", 6),
}

KEY_LINE = re.compile(r"^([a-z_]+) = ", re.MULTILINE)


@pytest.mark.parametrize("preset", ["seed", "quick"])
def test_init_writes_every_field_once_each_with_a_comment(preset):
    text = commented_toml(preset)
    keys = KEY_LINE.findall(text)
    assert sorted(keys) == sorted(EDITS), "a field init writes has no edit below, or is missing"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if KEY_LINE.match(line):
            assert lines[i - 1].startswith("# "), f"{line!r} has no comment above it"
    # nothing but [matrix] is a table header: a header would capture the keys after it
    assert re.findall(r"^\[[^\]]*\]", text, re.MULTILINE) == ["[matrix]"]


@pytest.mark.parametrize("key", sorted(EDITS))
def test_every_key_init_writes_is_read_back_when_edited(key):
    toml_value, expected = EDITS[key]
    text = commented_toml("seed")
    edited, n = re.subn(rf"^{key} = .*$", f"{key} = {toml_value}", text, flags=re.MULTILINE)
    assert n == 1
    m = Matrix.from_toml(edited)
    assert getattr(m, key) == expected
    assert getattr(Matrix.preset("seed"), key) != expected  # the edit is a change


def test_the_commented_extra_table_reads_back_when_uncommented():
    text = commented_toml("seed").replace(
        "# [matrix.extra]\n# temperature", "[matrix.extra]\ntemperature"
    )
    assert Matrix.from_toml(text).extra == {"temperature": 0.0}


@pytest.mark.parametrize(
    "text, message",
    [
        # the bug `init` wrote: a [slo] table header, then the keys that should be matrix's
        (
            "[matrix]\ncontexts = [8192]\n[slo]\nprecision = 0.02\n",
            r"^precision: sits in the \[slo\]",
        ),
        ("[matrix]\ncontexts = [8192]\n[slo]\nttft = 2000\n", r"^\[slo\]: .*\[matrix\.slo\]"),
        ("precison = 0.02\n[matrix]\ncontexts = [8192]\n", r"^precison: outside \[matrix\]"),
        ("[matrix]\ncontexts = [8192]\nprecison = 0.02\n", r"^precison: unknown matrix field"),
        ("[matrix]\ncontexts = [8192]\n[tuning]\nx = 1\n", r"^\[tuning\]: a table outside"),
    ],
)
def test_a_key_outside_matrix_or_unknown_is_an_error_naming_it(text, message):
    with pytest.raises(ValueError, match=message):
        Matrix.from_toml(text)


def test_the_cli_refuses_a_misplaced_key_in_one_line(tmp_path, capsys):
    path = tmp_path / "m.toml"
    path.write_text("[matrix]\ncontexts = [8192]\n[slo]\nprecision = 0.02\n")
    code = cli.main(
        ["run", "--url", "http://127.0.0.1:9", "--matrix", str(path), "--out", str(tmp_path / "o")]
        + ["--dry-run"]
    )
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert "precision: sits in the [slo] table" in err and len(err.strip().splitlines()) == 1


NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("duration_s", NAN, "duration_s: nan is not a positive number of seconds"),
        ("duration_s", INF, "duration_s: inf is not a positive number of seconds"),
        ("duration_s", 1e9, "duration_s: 1000000000.0 is not a positive number of seconds"),
        ("idle_timeout_s", NAN, "idle_timeout_s: nan"),
        ("request_idle_timeout_s", INF, "request_idle_timeout_s: inf"),
        ("prefill_cooldown_s", NAN, "prefill_cooldown_s: nan"),
        ("drain_timeout_s", INF, "drain_timeout_s: inf"),
        ("min_duration_s", NAN, "min_duration_s: nan"),
        ("stall_min_s", NAN, "stall_min_s: nan"),
        ("stall_gap_factor", NAN, "stall_gap_factor: nan"),
        ("stall_gap_factor", INF, "stall_gap_factor: inf"),
        ("ramp_cap_s", INF, "ramp_cap_s: inf"),
        ("error_threshold", NAN, "error_threshold: nan"),
        ("precision", NAN, "precision: nan"),
        ("attainment", NAN, "attainment: nan"),
        ("request_rates", [NAN], "request_rates: nan"),
        ("request_rates", [1e9], "request_rates: 1000000000.0"),
        ("concurrency", [1, 10**6], "concurrency: 1000000 is above"),
        ("max_concurrency", 10**6, "max_concurrency: 1000000 is above"),
        ("contexts", [8192, 10**12], "contexts: 1000000000000 is above"),
        ("prefill_contexts", [10**12], "prefill_contexts: 1000000000000 is above"),
        ("max_output", 10**12, "max_output: 1000000000000 is above"),
        ("repetitions", 10**6, "repetitions: 1000000 is above"),
        ("shared_prefix", -(10**12), "shared_prefix: -1000000000000 is beyond"),
    ],
)
def test_values_out_of_bounds_are_refused_naming_the_field(field, value, message):
    m = Matrix.preset("seed")
    setattr(m, field, value)
    problems = m.problems()
    assert any(p.startswith(message) for p in problems), problems


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_toml_nan_and_inf_are_refused(value):
    with pytest.raises(ValueError, match=r"duration_s: .* is not a positive number"):
        Matrix.from_toml(f"[matrix]\nduration_s = {value}\n").validate()


# ---------------------------------------------------------------- one URL rule, a wrong port
@pytest.mark.parametrize(
    "text, url",
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("HTTPS://h.example", "HTTPS://h.example"),
        (" localhost:1 ", "http://localhost:1"),
    ],
)
def test_base_url_takes_host_port_as_http(text, url):
    from speedmatrix.cliargs import base_url

    assert base_url(text) == url


@pytest.mark.parametrize(
    "text, message",
    [
        ("ftp://h:21", "--url must start with http:// or https://, not ftp://"),
        ("http://", "--url: the URL names no host"),
        ("127.0.0.1:port", "--url: the port is not a number"),
    ],
)
def test_a_bad_url_is_the_same_usage_error_with_and_without_dry_run(
    tmp_path, capsys, text, message
):
    for extra in ([], ["--dry-run"]):
        out = tmp_path / f"o{len(extra)}"
        code = cli.main(["run", "--url", text, "--out", str(out), "--quiet", *extra])
        err = capsys.readouterr().err
        assert code == cli.EXIT_USAGE, (extra, err)
        assert message in err and len(err.strip().splitlines()) == 1
        assert not out.exists()


@pytest.fixture
def plain_web_server(tmp_path):
    """A plain web server (Python's http.server) on 127.0.0.1: a wrong port. Counts the
    requests that are not GET (a generation request is a POST)."""
    import http.server
    import threading

    posts: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(tmp_path), **kw)

        def do_POST(self):
            posts.append(self.path)
            self.send_error(501)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], posts
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_plain_web_server_stops_at_discovery_and_writes_nothing(
    plain_web_server, tmp_path, capsys, dry_run
):
    port, posts = plain_web_server
    out = tmp_path / "run"
    argv = ["run", "--url", f"127.0.0.1:{port}", "--out", str(out), "--quiet"]
    argv += ["--contexts", "1k", "--duration", "1s"] + (["--dry-run"] if dry_run else [])
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == cli.EXIT_FAILURE
    assert f"http://127.0.0.1:{port} does not speak the OpenAI API" in captured.err
    assert "/v1/models answered HTTP 404" in captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err  # no warnings before it
    assert "Warning" not in captured.out
    assert posts == []  # no generation request
    assert not out.exists()  # no run folder, no report


@pytest.mark.parametrize("setting", ["step_base_ms=-5", "fixed_itl_ms=1e300"])
def test_the_built_in_engine_refuses_a_negative_or_huge_cost(setting):
    """`speedmatrix sim --set step_base_ms=-5` (issue 25): the profile's costs are checked
    where the engine parses its --set overrides, and the error names the field."""
    from speedmatrix.sim import Sim, SimError

    key, _, value = setting.partition("=")
    with pytest.raises(SimError, match=f"{key} must be a number from 0"):
        Sim("fixed", overrides={key: float(value)})


# ---------------------------------------------------------------- the demo is not the preset
def test_the_demo_names_how_its_matrix_differs_from_the_seed_preset():
    from speedmatrix import demo
    from speedmatrix.matrix import preset_record

    m = demo.demo_matrix(3.0)
    rec = demo.preset_note(m)
    assert rec["name"] == "seed"
    assert rec["changes"] == {
        "duration_s": {"preset": 30.0, "run": 3.0},
        "shared_prefix": {"preset": 0, "run": -demo.DEMO_UNIQUE_TAIL},
    }
    assert "share all but their last 512 tokens" in rec["text"]
    assert "every prompt unique" in rec["text"]
    intro = "\n".join(demo.intro_lines(m))
    assert rec["text"] in intro and "--preset seed shares nothing" in intro
    # the preset itself: no change, nothing to say
    assert preset_record(Matrix.preset("seed"), "seed") == {
        "name": "seed",
        "changes": {},
        "text": "",
    }


def test_matrix_sources_say_default_preset_file_and_flag(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text("[matrix]\nprecision = 0.02\nduration = 20\n")
    parse = cli.build_parser().parse_args
    src = cli_run.matrix_sources(parse(["run", "--matrix", str(path), "--duration", "10s"]))
    assert src["precision"] == "file m.toml"
    assert src["duration_s"] == "--duration"  # the flag wins over the file
    assert src["contexts"] == "default"
    src = cli_run.matrix_sources(parse(["run", "--preset", "seed", "--shared-prefix", "-512"]))
    assert src["contexts"] == "preset seed" and src["warmup"] == "default"
    assert src["shared_prefix"] == "--shared-prefix"


def test_the_report_names_how_the_matrix_differs_from_its_preset(tmp_path):
    # issue 21: the demo's shared prompts were said only in run.json; the report's Run
    # section says it too (and that a preset run is the preset, unchanged)
    import synthetic
    from speedmatrix import demo
    from speedmatrix.report.metadata import run_section
    from speedmatrix.results import load
    from speedmatrix.runfile import read_run, write_run

    synthetic.build_run(
        tmp_path, contexts=(8192,), concurrency=(1,), prefill_contexts=(), with_records=False
    )
    doc = read_run(tmp_path)
    note = demo.preset_note(demo.demo_matrix(3.0))
    doc["meta"]["run"]["preset"] = note
    write_run(tmp_path, doc)
    items = dict(run_section(load(tmp_path)).items)
    assert items["Matrix"] == note["text"] and "512 tokens" in items["Matrix"]
    doc["meta"]["run"]["preset"] = {"name": "seed", "changes": {}, "text": ""}
    write_run(tmp_path, doc)
    assert dict(run_section(load(tmp_path)).items)["Matrix"] == "the seed preset, unchanged"
    del doc["meta"]["run"]["preset"]
    write_run(tmp_path, doc)
    assert "Matrix" not in dict(run_section(load(tmp_path)).items)
