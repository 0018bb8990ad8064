"""The CLI under hostile input and data it must not lose (issue 14), fast tier: no
real-time engine. Every failure is one line on stderr with the documented exit status;
--out never silently replaces another run; a key from any source never reaches stderr."""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

import pytest
from cliproc import run_cli as _cli
from cliproc import run_main as _main
from speedmatrix import cli
from speedmatrix.cli import run as cli_run

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens


def _one_line(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def _cell(status: str, not_run: bool = False) -> dict:
    c = {"id": f"c{id(object())}", "status": status}
    if not_run:
        c["not_run"] = True
    return c


@pytest.mark.parametrize(
    "statuses, code",
    [
        (["valid", "valid", "over_capacity"], cli.EXIT_OK),
        (["valid", "queued"], cli.EXIT_OK),
        (["valid", "error"], cli.EXIT_PARTIAL),
        (["valid", "error!"], cli.EXIT_PARTIAL),  # ! = not run (server lost)
        (["error", "error", "over_capacity"], cli.EXIT_FAILURE),
        (["over_capacity"], cli.EXIT_FAILURE),
        ([], cli.EXIT_FAILURE),
    ],
)
def test_exit_status_of_a_finished_run(statuses, code):
    cells = [_cell(s.rstrip("!"), s.endswith("!")) for s in statuses]
    assert cli_run.run_exit_status({"cells": cells}) == code
    assert len({cli.EXIT_OK, cli.EXIT_FAILURE, cli.EXIT_USAGE, cli.EXIT_PARTIAL}) == 4


def _decode(context: int, n: int, status: str) -> dict:
    return {"phase": "decode", "context": context, "concurrency": n, "status": status}


@pytest.mark.parametrize(
    "cells, code",
    [
        # the matrix's edge: 8K measured at N = 1, 2, over capacity at 4
        ([_decode(8192, 1, "valid"), _decode(8192, 2, "valid"), _decode(8192, 4, "over_capacity")],
         cli.EXIT_OK),
        # a context the server cannot hold at any N (larger than a llama.cpp slot): asked,
        # never measured, so not every cell the user asked for was measured
        ([_decode(8192, 1, "valid"), _decode(65536, 1, "over_capacity"),
          _decode(65536, 2, "over_capacity")], cli.EXIT_PARTIAL),
        ([{"phase": "prefill", "context": 2048, "status": "valid"},
          _decode(2048, 1, "over_capacity")], cli.EXIT_PARTIAL),
    ],
)  # fmt: skip
def test_a_context_refused_at_every_concurrency_is_not_measured(cells, code):
    assert cli_run.run_exit_status({"cells": cells}) == code


def _saved_run(d: Path) -> bytes:
    d.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "speedmatrix.run/1", "meta": {"x": 1}, "cells": []}
    (d / "run.json").write_text(json.dumps(doc))
    (d / "records").mkdir()
    (d / "records" / "a.npz").write_bytes(b"rec")
    return (d / "run.json").read_bytes()


RUN = ["run", "--url", UNREACHABLE, "--contexts", "1k", "--concurrency", "1", "--quiet"]


def test_out_holding_another_run_is_refused(tmp_path):
    before = _saved_run(tmp_path / "old")
    res = _main(*RUN, "--out", str(tmp_path / "old"))
    assert res.returncode == cli.EXIT_FAILURE
    line = _one_line(res)
    assert "holds another run" in line and "--resume" in line and "--force" in line
    assert (tmp_path / "old" / "run.json").read_bytes() == before


def test_force_moves_the_other_run_aside_and_deletes_nothing(tmp_path):
    before = _saved_run(tmp_path / "old")
    res = _main(*RUN, "--out", str(tmp_path / "old"), "--force")
    assert "moved the previous run" in res.stderr
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("old.replaced-")]
    assert len(moved) == 1
    assert (moved[0] / "run.json").read_bytes() == before
    assert (moved[0] / "records" / "a.npz").read_bytes() == b"rec"
    assert not (tmp_path / "old" / "run.json").exists()  # the unreachable server: no new run


def test_out_that_is_a_file_or_cannot_be_made(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    res = _main(*RUN, "--out", str(f))
    assert res.returncode == cli.EXIT_FAILURE and "is a file" in _one_line(res)
    res = _main(*RUN, "--out", str(f / "sub"))
    assert res.returncode == cli.EXIT_FAILURE and "cannot make --out" in _one_line(res)


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"contexts = [1k\n", "does not parse"),
        (b'contexts = ["8k"]\nfrobnicate = 3\n', "unknown matrix field"),
        (b"\xff\xfe\x00c\x00o\x00n", "not UTF-8"),
    ],
    ids=["malformed", "unknown-field", "non-utf8"],
)
def test_bad_matrix_files_are_one_line(tmp_path, content, needle):
    m = tmp_path / "m.toml"
    m.write_bytes(content)
    res = _main("run", "--url", UNREACHABLE, "--matrix", str(m), "--out", str(tmp_path / "o"))
    assert res.returncode == cli.EXIT_USAGE
    assert needle in _one_line(res)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--preset", "nonesuch"], "invalid choice: 'nonesuch'"),
        (["--url", "ftp://example.com"], "http:// or https://"),
    ],
)
def test_bad_flags_are_one_line(tmp_path, args, needle):
    base = ["run", "--url", UNREACHABLE, "--out", str(tmp_path / "o"), "--contexts", "1k"]
    res = _cli(*base, *args)
    assert res.returncode == cli.EXIT_USAGE
    assert needle in _one_line(res)


@pytest.mark.parametrize(
    "content",
    [b"", b'{"schema": "speedmatrix.run/1", "cells": [', b"\x89PNG\x00\xff", b'{"schema": "x/2"}'],
    ids=["empty", "truncated", "binary", "wrong-schema"],
)
@pytest.mark.parametrize("command", ["report", "compare"])
def test_report_and_compare_on_damaged_run_files(tmp_path, content, command):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_bytes(content)
    args = [command, str(bad)] if command == "report" else [command, str(bad), str(bad)]
    # one file as a whole process (its exit status, nothing else on stderr); the rest in
    # this process, which spares the interpreter's start-up and heavy imports each time
    res = (_cli if content.startswith(b"\x89PNG") else _main)(*args)
    assert res.returncode == cli.EXIT_FAILURE
    assert str(bad) in _one_line(res)


def _low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_too_few_descriptors_is_the_clients_limit_said_before_any_cell(tmp_path):
    res = _cli(
        "run",
        "--url",
        UNREACHABLE,
        "--contexts",
        "1k",
        "--concurrency",
        "1,1024",
        "--out",
        str(tmp_path / "o"),
        preexec_fn=_low_fd_limit,
    )
    assert res.returncode == cli.EXIT_FAILURE
    line = _one_line(res)
    assert "open files" in line and "256" in line and "cannot reach" not in line


def test_a_key_from_a_file_never_reaches_stderr(tmp_path):
    from test_hostile import KEY, RawServer, _answer

    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    body = json.dumps({"error": {"message": f"key {KEY} unknown"}}).encode()
    with RawServer(lambda c, r: c.sendall(_answer("401 Unauthorized", body))) as server:
        res = _cli(
            *RUN[:2],
            server.url,
            *RUN[3:],
            "--out",
            str(tmp_path / "o"),
            "--api-key-file",
            str(key_file),
        )
    assert KEY not in res.stderr + res.stdout
    assert res.returncode == cli.EXIT_FAILURE and "refused" in _one_line(res)
    assert any(b"Bearer " + KEY.encode() in r for r in server.requests)  # it was sent


def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys, tmp_path):
    def boom(args):
        raise RuntimeError("sk-internal-secret-123456 exploded")

    monkeypatch.setitem(cli.COMMANDS, "report", boom)
    (tmp_path / "run.json").write_text("{}")  # the flags are read: a run folder
    assert cli.main(["report", str(tmp_path)]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError" in err and "--debug" in err
    assert "sk-internal-secret" not in err
    assert cli.main(["--debug", "report", str(tmp_path)]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "Traceback" in err and "sk-internal-secret" not in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--port", "70000"], "70000 is not a port"),
        (["--fault-drop", "0.6", "--fault-stall", "0.6"], "add up to 1.2"),
    ],
)
def test_sim_rejects_bad_ports_and_fault_shares(args, needle):
    res = _cli("sim", *args, timeout=20)
    assert res.returncode == cli.EXIT_USAGE
    assert needle in res.stderr and "Traceback" not in res.stderr


def test_progress_lines_and_warnings_are_redacted():
    import io

    from speedmatrix.progress import Progress

    buf = io.StringIO()
    p = Progress(True, stream=buf)
    p.secrets = ["k3y-from-env-123"]
    p.start_cell(1, 1, "decode 8K x 1", 1.0, 1.0)
    p.end_cell("error (server said: bad key k3y-from-env-123, Bearer tok-4567)")
    p.message("speedmatrix: warning: adapter failed: --api-key sk-abcdefghijkl")
    out = buf.getvalue()
    assert "k3y-from-env-123" not in out and "tok-4567" not in out and "sk-abcdefghijkl" not in out
    assert out.count("<redacted>") == 3
