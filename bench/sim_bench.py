"""The built-in engine's benchmark and the seed-h200 profile fit. Prints figures; never a test.

    python bench/sim_bench.py fit [--write]   fit seed-h200 to the seed report, print predicted vs seed
    python bench/sim_bench.py streams [N]     hold N (4096) concurrent paced streams, check they all flow
    python bench/sim_bench.py unpaced         unpaced emission rate (tokens/s) with raw-socket readers
    python bench/sim_bench.py check [S]       measure a few seed cells end to end (window S s)
    python bench/sim_bench.py all

Figures go to docs/PERFORMANCE.md ("The built-in engine").
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import resource
import selectors
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from speedmatrix.sim import Sim, profile_path

K = 1024
# The seed report (tests/data/seed_report.txt, a copy of shared/seed/), read by the
# same parser the tests use. Decode cells:
# (context, N) -> (total tok/s, per-request tok/s, TTFT ms, average active).
sys.path.insert(0, str(ROOT / "tests" / "python"))
from seed import label_tokens, reproducible, seed_cells

_SEED = seed_cells()
SEED_DECODE = {
    (label_tokens(c.label), c.concurrency): (
        c.total_tok_s,
        c.per_request_tok_s,
        c.ttft_ms,
        c.avg_active,
    )
    for c in _SEED
    if c.phase == "decode" and c.status != "over_capacity"
}
SEED_OVER = {
    (label_tokens(c.label), c.concurrency)
    for c in _SEED
    if c.phase == "decode" and c.status == "over_capacity"
}
SEED_PREFILL = {label_tokens(c.label): c.ttft_ms for c in _SEED if c.phase == "prefill"}
_REPRODUCIBLE = {(label_tokens(c.label), c.concurrency) for c in _SEED if reproducible(c)}
CONTEXTS = [8 * K, 16 * K, 32 * K, 64 * K, 123 * K]
CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128]
MAX_OUTPUT = 4096
WINDOW_S = 30.0


def good_cell(c: int, n: int) -> bool:
    """Cells whose average active requests track the concurrency (tests/python/seed.py's
    rule); the others carried work left over from earlier cells."""
    return (c, n) in _REPRODUCIBLE


# --- model (mirrors cpp/src/sim/engine.cpp) ---------------------------------
def step_ms(p: dict, n: float, kv: float) -> float:
    return (
        p["step_base_ms"]
        + p["step_per_seq_ms"] * n
        + p["step_per_seq2_ms"] * n * n
        + p["step_per_kv_token_ns"] * 1e-6 * kv
    )


def prefill_ms(p: dict, pos: float, n: float) -> float:
    mean = pos + (n - 1) / 2
    return n * (p["prefill_per_token_us"] * 1e-3 + p["prefill_per_token_ctx_ns"] * mean / 1e9)


def cold_ttft_ms(p: dict, c: int) -> float:
    chunks = -(-c // p["chunk_tokens"])
    return (
        p["frontend_overhead_ms"]
        + p["frontend_per_token_us"] * 1e-3 * c
        + prefill_ms(p, 0, c)
        + chunks * p["prefill_chunk_overhead_ms"]
    )


def warm_ttft_ms(p: dict, c: int, n: int, step: float) -> float:
    # Median request of a burst of n: it waits for the serial front-end of half the
    # burst, then on average half a step for the next iteration, then its 1-token tail.
    return (
        p["frontend_overhead_ms"]
        + (n // 2 + 1) * p["frontend_per_token_us"] * 1e-3 * c
        + step / 2
        + prefill_ms(p, c - 1, 1)
    )


def kv_attended(c: int, n: int, per_req: float) -> float:
    # Mean generated tokens per request over a 30 s window at per_req tok/s.
    return n * (c + per_req * WINDOW_S / 2)


def fit(write: bool) -> None:
    import numpy as np

    path = profile_path("seed-h200")
    prof = json.loads(path.read_text())
    cells = [(c, n) for (c, n) in SEED_DECODE if good_cell(c, n)]
    # 1. Decode step: step_ms = a + b n + c n^2 + d kv, least squares on relative error,
    # against both the per-request figure (1000 / tok/s) and the total (n / total tok/s),
    # which differ by a few % in the seed where TTFT eats into the window.
    rows, rhs = [], []
    for c, n in cells:
        total, per_req = SEED_DECODE[(c, n)][:2]
        kv = kv_attended(c, n, per_req)
        for target in (1000.0 / per_req, 1000.0 * n / total):
            rows.append(np.array([1.0, n, n * n, kv * 1e-6]) / target)
            rhs.append(1.0)
    x, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    a, b, c2, d = (float(v) for v in x)
    if c2 < 0:  # keep the curve convex: refit without the square term
        x, *_ = np.linalg.lstsq(np.array(rows)[:, [0, 1, 3]], np.array(rhs), rcond=None)
        a, b, d = (float(v) for v in x)
        c2 = 0.0
    prof.update(
        step_base_ms=round(a, 4),
        step_per_seq_ms=round(b, 5),
        step_per_seq2_ms=round(c2, 7),
        step_per_kv_token_ns=round(d, 4),
    )
    # 2. Front-end: warm TTFT of a burst of n = o + (n/2 + 1) s C + step/2, least squares.
    rows, rhs = [], []
    for c, n in cells:
        st = step_ms(prof, n, kv_attended(c, n, SEED_DECODE[(c, n)][1]))
        ttft = SEED_DECODE[(c, n)][2]
        rows.append(np.array([1.0, (n // 2 + 1) * c * 1e-3]) / ttft)
        rhs.append((ttft - st / 2) / ttft)
    (o, s), *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    prof.update(frontend_overhead_ms=round(float(o), 3), frontend_per_token_us=round(float(s), 4))
    # 3. Prefill: cold TTFT(C) - front-end = C tau0 + tau1 C^2 / 2.
    rows, rhs = [], []
    for c, ttft in SEED_PREFILL.items():
        c_eff = 125952 if c == 123 * K else c
        rest = ttft - prof["frontend_overhead_ms"] - prof["frontend_per_token_us"] * 1e-3 * c_eff
        rows.append(np.array([c_eff * 1e-3, c_eff * (c_eff - 1) / 2 * 1e-9]) / ttft)
        rhs.append(rest / ttft)
    (t0, t1), *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    prof.update(
        prefill_per_token_us=round(float(t0), 4),
        prefill_per_token_ctx_ns=round(float(t1), 4),
        prefill_chunk_overhead_ms=0.0,
    )
    report(prof)
    if write:
        path.write_text(json.dumps(prof, indent=2) + "\n")
        print(f"\nwrote {path}")


def report(prof: dict) -> None:
    kv_cap = prof["kv_tokens"]
    print(
        f"seed-h200 fit: step = {prof['step_base_ms']} + {prof['step_per_seq_ms']} n + "
        f"{prof['step_per_seq2_ms']} n^2 ms + {prof['step_per_kv_token_ns']} ns per KV token; "
        f"prefill {prof['prefill_per_token_us']} us/token + {prof['prefill_per_token_ctx_ns']} ns per "
        f"1K context; front-end {prof['frontend_overhead_ms']} ms + {prof['frontend_per_token_us']} "
        f"us/token serial; KV {kv_cap} tokens, max running {prof['max_running']}\n"
    )
    print("prefill          seed TTFT  model TTFT   seed tok/s  model tok/s   error")
    worst = 0.0
    for c, ttft in SEED_PREFILL.items():
        c_eff = 125952 if c == 123 * K else c
        m = cold_ttft_ms(prof, c_eff)
        err = (ttft / m - 1) * 100
        worst = max(worst, abs(err))
        print(
            f"  {c // K:>4}K    {ttft:>10.0f} {m:>11.0f} {c_eff / ttft * 1e3:>12.0f} "
            f"{c_eff / m * 1e3:>12.0f}  {err:+6.1f}%"
        )
    print(f"  worst prefill tok/s error {worst:.1f}%\n")
    print(
        "decode  ctx    N   seed tot  model tot    err   seed/req  model/req    err  "
        "seed TTFT model TTFT  fitted"
    )
    worst_t = worst_r = 0.0
    for (c, n), (tot, per, ttft, _act) in sorted(SEED_DECODE.items()):
        c_eff = 125952 if c == 123 * K else c
        st = step_ms(prof, n, kv_attended(c_eff, n, per))
        m_per = 1000 / st
        m_tot = n * m_per
        e_t, e_r = (m_tot / tot - 1) * 100, (m_per / per - 1) * 100
        g = good_cell(c, n)
        if g:
            worst_t, worst_r = max(worst_t, abs(e_t)), max(worst_r, abs(e_r))
        print(
            f"      {c // K:>4}K {n:>4} {tot:>10.1f} {m_tot:>10.1f} {e_t:+6.1f}% {per:>9.1f} "
            f"{m_per:>10.1f} {e_r:+6.1f}% {ttft:>10.0f} {warm_ttft_ms(prof, c_eff, n, st):>10.0f}"
            f"  {'yes' if g else 'no (leftover work in the seed)'}"
        )
    print(f"  worst error over fitted cells: total {worst_t:.1f}%, per request {worst_r:.1f}%\n")
    over = {
        (c, n)
        for c in CONTEXTS
        for n in CONCURRENCY
        if n * ((125952 if c == 123 * K else c) + MAX_OUTPUT) > kv_cap
    }
    print(
        f"over-capacity cells (N x (C + {MAX_OUTPUT}) > {kv_cap}): "
        f"{'exactly the seed' if over == SEED_OVER else 'DIFFERENT from the seed'} "
        f"({len(over)} cells)"
    )


# --- scale: many concurrent paced streams ----------------------------------------
def _raise_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _request(port: int, max_tokens: int, prompt: str = "a b c d") -> bytes:
    body = json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    ).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _reader(
    port: int, n_streams: int, max_tokens: int, q: mp.Queue[tuple[int, int, float]]
) -> None:
    """Opens n_streams streams, reads them to the end, counts events (b'data: {')."""
    _raise_nofile()
    sel = selectors.DefaultSelector()
    req = _request(port, max_tokens)
    socks = []
    for _ in range(n_streams):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(req)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, [b""])
        socks.append(s)
    t0 = time.monotonic()
    events = done = 0
    open_ = n_streams
    while open_:
        for key, _ in sel.select(timeout=30):
            s = key.fileobj
            try:
                data = s.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(s)
                s.close()
                open_ -= 1
                continue
            carry = key.data[0] + data
            events += carry.count(b"data: {")
            if b"data: [DONE]" in carry:
                done += 1
                sel.unregister(s)
                s.close()
                open_ -= 1
                continue
            key.data[0] = carry[-8:]  # a marker split across reads is counted once
            events -= key.data[0].count(b"data: {")
    q.put((events, done, time.monotonic() - t0))


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def streams(n: int = 4096, procs: int = 4, itl_ms: float = 20.0, seconds: float = 10.0) -> dict:
    """n paced streams at once against the fixed profile (TTFT 50 ms, ITL itl_ms), each
    `seconds` long: long enough for every stream to be open at the same time."""
    _raise_nofile()
    max_tokens = int(seconds * 1000 / itl_ms)
    with Sim("fixed", overrides={"fixed_itl_ms": itl_ms}) as sim:
        pid = sim._proc.pid
        c0 = _cpu_s(pid)
        q: mp.Queue = mp.Queue()
        ps = [
            mp.Process(target=_reader, args=(sim.port, n // procs, max_tokens, q))
            for _ in range(procs)
        ]
        t0 = time.monotonic()
        for p in ps:
            p.start()
        peak = 0
        while any(p.is_alive() for p in ps):
            try:
                peak = max(peak, sim.state()["running"])
            except OSError:
                pass
            time.sleep(0.2)
        res = [q.get() for _ in ps]
        wall = time.monotonic() - t0
        st = sim.state()
        cpu = _cpu_s(pid) - c0
    events = sum(r[0] for r in res)
    done = sum(r[1] for r in res)
    out = {
        "streams": n,
        "completed": done,
        "tokens": events,
        "expected_tokens": n * max_tokens,
        "peak_running": peak,
        "wall_s": round(wall, 2),
        "engine_tokens_sent": st["tokens_sent"],
        "engine_cpu_s": round(cpu, 2),
        "engine_us_per_token": round(cpu / max(events, 1) * 1e6, 2),
    }
    print(
        f"streams: {n} concurrent paced streams (ITL {itl_ms:g} ms, {max_tokens} tokens each): "
        f"completed {done}/{n}, tokens {events}/{n * max_tokens}, peak running {peak}, "
        f"wall {wall:.1f} s (ideal {0.05 + itl_ms / 1000 * (max_tokens - 1):.1f} s + connect), "
        f"{events / wall / 1e3:.0f}K tok/s delivered, engine CPU {cpu:.1f} s = "
        f"{out['engine_us_per_token']} us/token"
    )
    return out


def unpaced(procs: int = 3, streams_per_proc: int = 8, max_tokens: int = 200_000) -> dict:
    """Unpaced emission rate: the engine writes as fast as the sockets take it."""
    with Sim("fixed", unpaced=True, overrides={"context_length": 1 << 22}) as sim:
        pid = sim._proc.pid
        q: mp.Queue = mp.Queue()
        ps = [
            mp.Process(target=_reader, args=(sim.port, streams_per_proc, max_tokens, q))
            for _ in range(procs)
        ]

        def cpu() -> float:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        c0, t0 = cpu(), time.monotonic()
        for p in ps:
            p.start()
        res = [q.get() for _ in ps]
        wall = time.monotonic() - t0
        c1 = cpu()
        for p in ps:
            p.join()
    tokens = sum(r[0] for r in res)
    rate = tokens / wall
    cpu_s = c1 - c0
    out = {
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tok_s": round(rate),
        "engine_cpu_s": round(cpu_s, 2),
        "engine_us_per_token": round(cpu_s / tokens * 1e6, 3),
        "engine_tok_per_cpu_s": round(tokens / cpu_s) if cpu_s else None,
    }
    print(
        f"unpaced: {tokens} tokens over {procs * streams_per_proc} streams in {wall:.2f} s = "
        f"{rate / 1e6:.2f} M tok/s; engine CPU {cpu_s:.2f} s = {out['engine_us_per_token']} us/token "
        f"({(out['engine_tok_per_cpu_s'] or 0) / 1e6:.2f} M tok per engine CPU-second)"
    )
    return out


def _window_reader(port: int, bodies: list[bytes], window_s: float, q) -> None:
    """Sends the bodies at once, reads for window_s, reports token arrival times per stream."""
    sel = selectors.DefaultSelector()
    socks = []
    t_send = time.monotonic_ns()
    for b in bodies:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        req = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(b)}\r\n\r\n"
        ).encode() + b
        s.sendall(req)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, [])
        socks.append(s)
    end = t_send + int(window_s * 1e9)
    while time.monotonic_ns() < end:
        for key, _ in sel.select(timeout=0.01):
            try:
                data = key.fileobj.recv(1 << 20)
            except BlockingIOError:
                continue
            t = time.monotonic_ns()
            n = data.count(b'"text":"')
            key.data.extend([t] * n)
    q.put((t_send, [k.data for k in sel.get_map().values()]))
    for s in socks:
        s.close()


def check(window_s: float = 8.0) -> None:
    """Measures a few seed cells end to end against seed-h200 (warm-ups marked
    sm_prefill_free so that they cost nothing) and prints them beside the seed."""
    import statistics

    cells = [(8 * K, 1), (8 * K, 16), (8 * K, 64), (32 * K, 8), (64 * K, 16), (125952, 8)]
    print(f"check: seed-h200 measured by a Python raw-socket reader, window {window_s:g} s")
    print(
        "   ctx    N  seed tot  meas tot  (after 1st tok)  seed/req  meas/req  seed TTFT  meas TTFT"
    )
    with Sim("seed-h200") as sim:
        for c, n in cells:
            bodies = []
            for i in range(n):
                prompt = [100_000 + i] + list(
                    range(1, c)
                )  # a salt first: no sharing between requests
                bodies.append(
                    {"model": "muse-glimmer", "prompt": prompt, "max_tokens": 4096, "stream": True}
                )
            warm = [
                json.dumps(
                    {**b, "max_tokens": 1, "stream": False, "sm_prefill_free": True}
                ).encode()
                for b in bodies
            ]
            for w in warm:
                urlopen_post(sim.url, w)
            q: mp.Queue = mp.Queue()
            p = mp.Process(
                target=_window_reader,
                args=(sim.port, [json.dumps(b).encode() for b in bodies], window_s, q),
            )
            p.start()
            t_send, per_stream = q.get()
            p.join()
            tokens = sum(len(t) for t in per_stream)
            firsts = [t[0] for t in per_stream if t]
            gaps = [(b - a) / 1e6 for t in per_stream for a, b in itertools.pairwise(t)]
            ttft = statistics.median((f - t_send) / 1e6 for f in firsts)
            tbt = statistics.median(gaps)
            after = tokens / (window_s - ttft / 1000)
            seed = SEED_DECODE[(c if c != 125952 else 123 * K, n)]
            print(
                f"  {c // K:>4}K {n:>4} {seed[0]:>9.1f} {tokens / window_s:>9.1f} {after:>16.1f} "
                f"{seed[1]:>9.1f} {1000 / tbt:>9.1f} {seed[2]:>10.0f} {ttft:>10.0f}"
            )
            sim.wait_idle(60)
            urlopen_post(sim.url, b"{}", "/flush_cache")


def urlopen_post(url: str, body: bytes, path: str = "/v1/completions") -> bytes:
    import urllib.request

    req = urllib.request.Request(
        url + path, data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read()


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "all"
    if what == "fit":
        fit(write="--write" in argv)
    elif what == "report":
        report(json.loads(profile_path("seed-h200").read_text()))
    elif what == "streams":
        streams(
            int(argv[1]) if len(argv) > 1 else 4096,
            int(argv[2]) if len(argv) > 2 else 4,
            float(argv[3]) if len(argv) > 3 else 20.0,
        )
    elif what == "unpaced":
        unpaced()
    elif what == "check":
        check(float(argv[1]) if len(argv) > 1 else 8.0)
    elif what == "all":
        report(json.loads(profile_path("seed-h200").read_text()))
        print()
        streams(4096, itl_ms=100.0)
        streams(4096, itl_ms=20.0)
        unpaced()
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
