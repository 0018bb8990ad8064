"""The discovery client on httpx (today's speedmatrix/http.py) against the urllib one it
replaced, side by side, against the built-in engine on 127.0.0.1.

    PYTHONPATH=python python bench/http_client_bench.py [--n 300] [--discover 20] [--rev REV]

The urllib client is the last version of python/speedmatrix/http.py in git history that
was built on urllib's openers (or the one at ``--rev``), loaded in its own process as
``speedmatrix.http`` before anything imports it, so discovery runs on it unchanged. Each
client runs in a fresh process and prints, as JSON:

  - ``import_ms``: importing the HTTP library itself (``httpx``, or ``urllib.request``), the
    one-time cost httpx pays on the first request (speedmatrix imports it lazily, so
    ``speedmatrix --help`` never does);
  - ``first_call_ms``: a fresh process's first GET /v1/models, import included;
  - per call (median and p95 over ``--n`` calls): GET /v1/models, GET /metrics (text),
    POST /tokenize, on one client (httpx keeps the connection alive; urllib opens one per
    request) and with a new client per call;
  - ``discover_ms``: median of ``--discover`` whole discover() runs (about ten requests);
  - ``max_rss_mb`` of the process at the end.

Figures are written to docs/PERFORMANCE.md by hand; this prints them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTTP_PY = "python/speedmatrix/http.py"


def _urllib_source(rev: str | None) -> str:
    """http.py at ``rev``, or at the newest commit whose http.py was built on urllib."""
    if rev:
        return subprocess.check_output(["git", "show", f"{rev}:{HTTP_PY}"], cwd=ROOT, text=True)
    revs = subprocess.check_output(
        ["git", "log", "--format=%H", "--", HTTP_PY], cwd=ROOT, text=True
    ).split()
    for r in revs:
        src = subprocess.check_output(["git", "show", f"{r}:{HTTP_PY}"], cwd=ROOT, text=True)
        if "urllib.request.build_opener" in src:
            return src
    raise SystemExit("no urllib version of speedmatrix/http.py in git history (use --rev)")


def _ms(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s) * 1e3, 3),
        "p95_ms": round(s[int(0.95 * (len(s) - 1))] * 1e3, 3),
    }


def _worker(kind: str, old_path: str | None, url: str, n: int, n_discover: int) -> None:
    t0 = time.perf_counter()
    if old_path:  # the urllib client, as speedmatrix.http for everything that imports it
        spec = importlib.util.spec_from_file_location("speedmatrix.http", old_path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["speedmatrix.http"] = mod
        spec.loader.exec_module(mod)
    from speedmatrix import http as smhttp

    client = smhttp.HttpClient(url, timeout_s=10)
    client.get_json("/v1/models")
    first_call = time.perf_counter() - t0
    assert ("httpx" in sys.modules) == (kind == "httpx"), "the wrong client was measured"
    lib = "httpx" if kind == "httpx" else "urllib.request"
    import_s = _import_time(lib)

    calls = {
        "GET /v1/models": lambda c: c.get_json("/v1/models"),
        "GET /metrics": lambda c: c.get_text("/metrics"),
        "POST /tokenize": lambda c: c.post_json("/tokenize", {"prompt": "the quick brown fox"}),
    }
    out: dict[str, object] = {
        "client": kind,
        "import_ms": round(import_s * 1e3, 1),
        "first_call_ms": round(first_call * 1e3, 1),
    }
    for name, call in calls.items():
        for _ in range(20):  # warm
            call(client)
        same = []
        for _ in range(n):
            t = time.perf_counter()
            call(client)
            same.append(time.perf_counter() - t)
        fresh = []
        for _ in range(n):
            t = time.perf_counter()
            c = smhttp.HttpClient(url, timeout_s=10)
            call(c)
            if hasattr(c, "close"):
                c.close()
            fresh.append(time.perf_counter() - t)
        out[name] = {"one client": _ms(same), "new client per call": _ms(fresh)}
    from speedmatrix.adapters import discover

    disc = []
    for _ in range(n_discover):
        t = time.perf_counter()
        discover(url)
        disc.append(time.perf_counter() - t)
    out["discover"] = _ms(disc)
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out))


def _import_time(lib: str) -> float:
    """Median wall time of importing ``lib`` in a fresh interpreter, less a bare start."""
    code = f"import time; t = time.perf_counter(); import {lib}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(5)
    ]
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="calls per request kind (default 300)")
    ap.add_argument("--discover", type=int, default=20, help="discover() runs (default 20)")
    ap.add_argument("--rev", help="git revision of the urllib http.py (default: the newest)")
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "OLD", "URL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        kind, old, url = a.worker
        _worker(kind, old if old != "-" else None, url, a.n, a.discover)
        return
    from speedmatrix.sim import Sim

    with tempfile.TemporaryDirectory() as tmp, Sim("seed-h200", flavour="sglang") as sim:
        old = Path(tmp) / "http_urllib.py"
        old.write_text(_urllib_source(a.rev))
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        for kind, path in (("urllib", str(old)), ("httpx", "-")):
            args = [sys.executable, __file__, "--n", str(a.n), "--discover", str(a.discover)]
            res = subprocess.run(
                [*args, "--worker", kind, path, sim.url],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            print(res.stdout.strip())


if __name__ == "__main__":
    main()
