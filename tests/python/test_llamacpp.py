"""A real engine, end to end: llama.cpp's ``llama-server`` (built by scripts/llamacpp.sh into
a cache outside the clone) serving a tiny random-weight GGUF written here, started on
127.0.0.1 in both launch modes:

- ``split``:   ``--parallel 4 -c 8192`` -> four 2048-token slot caches
- ``unified``: no ``--parallel`` -> 4 slots over one unified pool of the trained context

The server does not say which layout it runs: only the slot rule is planned, and the cells
the unified pool cannot hold are judged over capacity by the server's own refusal.

Never skipped in CI: a missing binary fails with the build script's name, unless
``SPEEDMATRIX_LLAMACPP=skip`` is set explicitly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cliproc import free_port as _free_port
from speedmatrix import discover
from speedmatrix.matrix import Matrix
from speedmatrix.prompts import WORDS
from speedmatrix.sweep import run
from tiny_gguf import write_tiny_model

pytestmark = [pytest.mark.llamacpp, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "llamacpp.sh"
N_CTX_TRAIN = 4096
SLOTS = 4
MAX_OUTPUT = 128
MODES = {
    "split": ["--parallel", str(SLOTS), "-c", "8192"],
    "unified": [],
}


def _binary() -> Path:
    path = Path(
        subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    if not path.is_file():
        if os.environ.get("SPEEDMATRIX_LLAMACPP") == "skip":
            pytest.skip("SPEEDMATRIX_LLAMACPP=skip: real-engine tests skipped on request")
        pytest.fail(
            f"llama-server is not built ({path} is missing): run scripts/llamacpp.sh "
            "(scripts/test.sh does), or set SPEEDMATRIX_LLAMACPP=skip to skip on purpose",
            pytrace=False,
        )
    return path


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def _post(url: str, body: dict, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _metrics(url: str) -> dict[str, float]:
    _, text = _get(url + "/metrics")
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class LlamaServer:
    """``llama-server`` on 127.0.0.1 with the tiny model; stopped on exit."""

    def __init__(self, binary: Path, model: Path, args: list[str], log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--metrics", "--threads", "1", "--threads-http", "8", "--no-warmup", *args]
        self.cmd = cmd
        self._log = open(log, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"llama-server exited at start:\n{self.log_tail()}", pytrace=False)
            if _get(self.url + "/health", 1.0)[0] == 200:
                return
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"llama-server not healthy after 120 s:\n{self.log_tail()}", pytrace=False)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def binary() -> Path:
    return _binary()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny-llama-f32.gguf"
    return write_tiny_model(path, N_CTX_TRAIN, words=WORDS)


@pytest.fixture(scope="module", params=list(MODES))
def server(request, binary, tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("llama") / f"{request.param}.log"
    s = LlamaServer(binary, tiny_model, MODES[request.param], log)
    s.mode = request.param
    print(f"\nllamacpp: {request.param}: {' '.join(s.cmd[1:])}")
    yield s
    s.stop()


def test_discovery_reads_what_the_server_says(server):
    t = discover(server.url)
    assert t.engine == "llamacpp"
    assert t.build and t.version and t.version.startswith("b")
    assert t.max_running == SLOTS
    assert t.info["n_ctx_train"] == N_CTX_TRAIN
    assert t.quantization and "F32" in t.quantization
    # the server does not say whether its slots share one cache: the layout is unknown
    # and no pool is claimed (the refusals judge what does not fit)
    assert t.info["kv_layout"]["unified"] is None, t.info["kv_layout"]
    assert t.kv_tokens is None
    unified = server.mode == "unified"
    assert t.context_length == (N_CTX_TRAIN if unified else 8192 // SLOTS)
    # the served name is the model file's stem, never the server's path
    assert t.info["model_path"].endswith("tiny-llama-f32.gguf")


def _matrix(api: str) -> Matrix:
    return Matrix(
        contexts=[256, 1024],
        concurrency=[1, 2, SLOTS, SLOTS + 1],
        prefill_contexts=[256, 1024],
        max_output=MAX_OUTPUT,
        duration_s=2.0,
        api=api,
        prefill_cooldown_s=0.2,
    )


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_matrix_end_to_end(server, api, tmp_path, capsys):
    before = _metrics(server.url)
    result = run(
        server.url,
        _matrix(api),
        out=tmp_path / "run",
        progress=False,
        report=False,
        info={"launch_command": " ".join(server.cmd)},  # settles the split layout
    )
    after = _metrics(server.url)
    cells = {c["id"]: c for c in result.doc["cells"]}
    # the CI log shows the matrix measured (pytest -q captures print otherwise)
    with capsys.disabled():
        print(f"\nllamacpp: {server.mode} {api}: llama-server {' '.join(server.cmd[3:])}")
        for cid, c in cells.items():
            tok = c.get("per_request_tok_s")
            print(
                f"  {cid:24} {c.get('status')!s:14} {c.get('flags', [])} "
                f"{'' if tok is None else f'{tok:.0f} tok/s per request'} "
                f"{c.get('reason', '')}"
            )

    req = result.requests
    window = req[(req["cell_phase"] == "decode") & (req["phase"] == "window")]
    # no request fails on a healthy server but those it refused for lack of context
    over = [cid for cid, c in cells.items() if c.get("status") == "over_capacity"]
    failed = req[(req["outcome"] == "error") & ~req["cell"].isin(over)]
    assert failed.empty, failed[["cell", "error_kind", "error_message"]]
    done = window[(window["outcome"] == "ok") & ~window["cell"].isin(over)]
    assert len(done) > 0
    # output counts are the server's usage, forced to max_output
    assert (done["token_source"] >= 2).all()
    assert (done["output_tokens"] == MAX_OUTPUT).all()
    # prompts exact by the server's own count, chat too (through the server's template)
    assert (done["prompt_tokens"] == done["context"]).all(), done[
        ["cell", "prompt_tokens", "context"]
    ]
    assert not [cid for cid, c in cells.items() if c.get("status") == "error"]
    # the cut requests do not flag a cell whose completed requests all had usage (the
    # flags of a cell the server refused are not reported)
    for cid, c in cells.items():
        if cid not in over:
            assert "estimated_tokens" not in (c.get("flags") or []), cid

    unified = server.mode == "unified"
    for c in cells.values():
        if c["phase"] != "decode":
            continue
        fits = (min(c["concurrency"], SLOTS) * (c["context"] + MAX_OUTPUT)) <= N_CTX_TRAIN
        if unified and not fits:
            # sent (the pool is not known), refused by the server: its words are the reason
            assert c["status"] == "over_capacity", c
            assert "Context size has been exceeded" in c["reason"], c["reason"]
        elif c["concurrency"] > SLOTS:
            assert c["status"] == "queued", c
        else:
            assert c["status"] == "valid", c

    # per-request decode speed vs llama.cpp's own count of generation time over the matrix
    # (counter deltas: tokens predicted / seconds spent predicting, N <= slots cells)
    tokens = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    seconds = (
        after["llamacpp:tokens_predicted_seconds_total"]
        - before["llamacpp:tokens_predicted_seconds_total"]
    )
    assert tokens > 0 and seconds > 0
    print(f"llamacpp: server decode {tokens / seconds:.0f} tok/s per request (its timings)")


def test_context_beyond_the_slot_is_refused_before_any_request(server, tmp_path):
    # a slot holds 2048 tokens split, the whole 4096-token pool unified
    slot = 8192 // SLOTS if server.mode == "split" else N_CTX_TRAIN
    before = _metrics(server.url)
    cmd = [
        sys.executable,
        "-m",
        "speedmatrix.cli",
        "run",
        "--url",
        server.url,
        "--contexts",
        str(slot),
        "--concurrency",
        "1",
        "--duration",
        "1s",
        "--max-output",
        str(MAX_OUTPUT),
        "--out",
        str(tmp_path / "run"),
        "--quiet",
        "--no-report",
        "--launch-command",
        " ".join(server.cmd),
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    after = _metrics(server.url)
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    (cell,) = [c for c in doc["cells"] if c["phase"] == "decode"]
    assert cell["status"] in ("error", "over_capacity")
    assert re.search(rf"{slot} \+ .*{slot}", cell["reason"]), cell["reason"]
    assert after["llamacpp:prompt_tokens_total"] == before["llamacpp:prompt_tokens_total"]
    # Not every cell asked for was measured: 1 when nothing was (this matrix has no other
    # cell), 3 beside measured cells (speedmatrix.cli.run.run_exit_status).
    assert proc.returncode == 1, proc.stderr


def test_speed_agrees_with_the_servers_timings(server, tmp_path, capsys):
    """One N=1 cell: speedmatrix's per-request decode tok/s vs the server's own
    (tokens_predicted_total / tokens_predicted_seconds_total over the cell)."""
    m = Matrix(contexts=[256], concurrency=[1], max_output=128, duration_s=3.0, warmup=False)
    before = _metrics(server.url)
    result = run(server.url, m, out=tmp_path / "run", progress=False, report=False)
    after = _metrics(server.url)
    tokens = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    seconds = (
        after["llamacpp:tokens_predicted_seconds_total"]
        - before["llamacpp:tokens_predicted_seconds_total"]
    )
    server_tok_s = tokens / seconds
    req = result.requests
    done = req[(req["outcome"] == "ok") & (req["phase"] == "window")]
    # the server's figure is the same ratio over its requests: generated tokens over the time
    # from the first to the last (n_decoded / t_token_generation, summed)
    dur_s = (done["done_ms"] - done["first_token_ms"]) / 1000
    ours = float(done["output_tokens"].sum() / dur_s.sum())
    with capsys.disabled():
        print(
            f"\nllamacpp: {server.mode}: decode per request {ours:.0f} tok/s measured, "
            f"{server_tok_s:.0f} tok/s by llama.cpp ({len(done)} requests)"
        )
    assert abs(ours - server_tok_s) <= 0.10 * server_tok_s


def test_unified_pool_below_the_trained_context_is_not_taken_for_split_slots(
    binary, tiny_model, tmp_path, capsys
):
    """Issue 21: ``-np 2 -c 2048 --kv-unified`` looks like split slots (a slot context
    below the trained 4096) but holds one 2048-token pool. With no launch command the
    layout is unknown: no pool is claimed, 1024 × 2 is sent and the server's refusal makes
    it over capacity in its words; with the launch command the pool is known and the cell
    is over capacity before any request. 1024 × 1 runs in both."""
    launch = "llama-server --parallel 2 -c 2048 --kv-unified"
    s = LlamaServer(binary, tiny_model, launch.split()[1:], tmp_path / "l.log")
    try:
        t = discover(s.url)
        assert t.info["kv_layout"]["unified"] is None, t.info["kv_layout"]
        m = Matrix(
            contexts=[1024], concurrency=[1, 2], prefill_contexts=[], max_output=64, duration_s=1.0
        )
        unknown = run(s.url, m, out=tmp_path / "unknown", progress=False, report=False)
        given = run(
            s.url,
            m,
            out=tmp_path / "given",
            progress=False,
            report=False,
            info={"launch_command": launch},
        )
    finally:
        s.stop()
    for result, how in ((unknown, "unknown"), (given, "launch command")):
        cells = {c["concurrency"]: c for c in result.doc["cells"] if c["phase"] == "decode"}
        with capsys.disabled():
            print(f"\nllamacpp: unified below n_ctx_train, {how}: ", end="")
            print([(n, c["status"]) for n, c in cells.items()])
        assert cells[1]["status"] == "valid", cells[1]
        assert cells[2]["status"] == "over_capacity", cells[2]
    assert (
        "Context size has been exceeded"
        in {c["concurrency"]: c for c in unknown.doc["cells"] if c["phase"] == "decode"}[2][
            "reason"
        ]
    )
    given_cells = {c["concurrency"]: c for c in given.doc["cells"] if c["phase"] == "decode"}
    assert "unified KV pool 2,048" in given_cells[2]["reason"]
    assert (given.requests["outcome"] != "error").all()
