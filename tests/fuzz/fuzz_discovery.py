"""Mutation fuzzer of the discovery-answer parsers (speedmatrix.adapters), which are Python:
libFuzzer cannot drive them. Seeds are the recorded servers of tests/data/discovery; each
round mutates one or more answers (a leaf replaced by a hostile value, a key dropped, a body
truncated or replaced by bytes, a status changed) and runs discover() on them in-process
(HttpClient.request is replaced by the recorded routes: no sockets, ~1 ms a round).

The contract checked: discover() returns a Target or raises a SpeedmatrixError, never any
other exception. A failing input is written to tests/fuzz/regressions/discovery/ and the run
exits 1; `--replay` (and tests/python/test_fuzz_regressions.py) runs every kept input.

    python tests/fuzz/fuzz_discovery.py --seconds 25 [--seed N]
    python tests/fuzz/fuzz_discovery.py --replay
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import sys
import time
import traceback
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEEDS = HERE.parent / "data" / "discovery"
REGRESSIONS = HERE / "regressions" / "discovery"

HOSTILE = [
    None,
    -1,
    0,
    2**63,
    2**70,
    1e308,
    -1e308,
    True,
    "",
    "x" * 5000,
    "\x00\xff",
    "nan",
    [],
    {},
    [None],
    {"": None},
    "-5",
    "1e999",
]


def install(routes: dict) -> None:
    """Makes every HttpClient answer from ``routes`` ("METHOD /path" -> {status, json|text})."""
    from speedmatrix import http

    def request(self, method, path, body=None, *, timeout_s=None, accept="application/json"):
        url = self.url(path)
        r = routes.get(f"{method} {urllib.parse.urlsplit(url).path}")
        if not isinstance(r, dict):
            raise http.HttpError(method, url, 404, "Not Found")
        status = r.get("status", 200)
        status = status if isinstance(status, int) and 100 <= status < 600 else 200
        payload = r["json"] if "json" in r else r.get("text", "")
        text = payload if isinstance(payload, str) else json.dumps(payload)
        if status in (401, 403):
            raise http.AuthError(method, url, status, text, self.has_api_key)
        if status >= 400:
            raise http.HttpError(method, url, status, text)
        return status, text

    http.HttpClient.request = request


def run_one(routes: dict) -> str | None:
    """None when discover() kept its contract, else the traceback."""
    from speedmatrix.adapters import discover
    from speedmatrix.errors import SpeedmatrixError

    install(routes)
    try:
        discover("http://fuzz.invalid:8000")
    except SpeedmatrixError:
        pass
    except Exception:  # noqa: BLE001 - the contract broken: report it
        return traceback.format_exc()
    return None


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    yield path


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _drop(obj, path):
    for k in path[:-1]:
        obj = obj[k]
    if isinstance(obj, dict):
        obj.pop(path[-1], None)


def mutate(routes: dict, rng: random.Random) -> dict:
    routes = copy.deepcopy(routes)
    for _ in range(rng.randint(1, 4)):
        if not routes:
            break
        key = rng.choice(sorted(routes))
        r = routes[key]
        if not isinstance(r, dict):
            continue
        op = rng.random()
        if "json" in r and op < 0.55:
            paths = [p for p in _leaves(r["json"]) if p]
            if paths:
                p = rng.choice(paths)
                if rng.random() < 0.8:
                    _set(r["json"], p, copy.deepcopy(rng.choice(HOSTILE)))
                else:
                    _drop(r["json"], p)
            else:
                r["json"] = copy.deepcopy(rng.choice(HOSTILE))
        elif op < 0.7:
            text = r.pop("json", None)
            text = json.dumps(text) if text is not None else r.get("text", "")
            cut = rng.randint(0, len(text))
            r["text"] = text[:cut]
        elif op < 0.8:
            r.pop("json", None)
            r["text"] = rng.randbytes(rng.randint(0, 200)).decode("latin-1")
        elif op < 0.9:
            r["status"] = rng.choice([200, 204, 301, 400, 401, 404, 429, 500, 503])
        else:
            del routes[key]
    return routes


def _keep(routes: dict, trace: str) -> Path:
    REGRESSIONS.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"routes": routes}, indent=1, ensure_ascii=False, default=str)
    path = REGRESSIONS / f"crash-{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"
    path.write_text(text)
    print(trace, file=sys.stderr)
    return path


def replay() -> int:
    bad = 0
    files = sorted(REGRESSIONS.glob("*.json"))
    for f in files:
        trace = run_one(json.loads(f.read_text())["routes"])
        if trace:
            print(f"{f.name}: discover() broke its contract\n{trace}", file=sys.stderr)
            bad += 1
    print(f"replayed {len(files)} discovery inputs, {bad} failing")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--replay", action="store_true")
    a = ap.parse_args()
    # The package must import whole first: a missing compiled core is the setup's fault,
    # not an input that breaks discovery, and must not be kept as one.
    from speedmatrix._native import _core  # noqa: F401 - raises with how to build it

    if a.replay:
        return replay()
    import warnings

    warnings.simplefilter("ignore")
    seeds = [json.loads(p.read_text())["routes"] for p in sorted(SEEDS.rglob("*.json"))]
    seed = a.seed if a.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    deadline = time.monotonic() + a.seconds
    rounds = failures = 0
    sites: set[str] = set()
    while time.monotonic() < deadline:
        routes = mutate(rng.choice(seeds), rng)
        trace = run_one(routes)
        rounds += 1
        if trace:
            failures += 1
            # one kept input per place of failure (last frame and exception type)
            frames = [ln for ln in trace.splitlines() if ln.lstrip().startswith("File ")]
            site = (frames[-1].strip() if frames else "") + trace.strip().splitlines()[-1][:40]
            if site not in sites:
                sites.add(site)
                print(
                    f"discovery fuzz: contract broken, kept {_keep(routes, trace)}", file=sys.stderr
                )
    print(
        f"discovery fuzz: seed {seed}, {rounds} rounds, {failures} failures at {len(sites)} places"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
