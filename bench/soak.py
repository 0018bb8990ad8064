"""Soak benchmark of the client core: many streams for a long window against the built-in
engine, watching the client's memory and descriptors and accounting for every token.

    PYTHONPATH=python python3 bench/soak.py [--streams 1024] [--duration 600] [--max-tokens 2000]
        [--spill-requests N] [--smaps] [--json FILE]

One cell (closed loop: each stream sends its next request when one ends, so connections
and requests turn over all the time) runs on a worker thread while this thread samples, once
a second, the process's RSS (/proc/self/status) and open descriptors (/proc/self/fd). It
prints:
  RSS after the first minute (or the first sixth of a shorter run) and at the end, and the
  growth between them (target: under 5 %; the window's token events and finished request
  records are spilled to disk past CellSpec.spill_events / spill_requests, so they hold a
  bounded tail, docs/RELIABILITY.md), and glibc's heap: bytes in use, free but held, mmapped;
  descriptors before, at the peak, and after the cell (target: back to the start: no leak);
  tokens counted by the client vs tokens the engine says it sent (GET /sim/state): the
  difference is tokens written to sockets the client had already closed at the window's end,
  at most one event's worth per stream.
A benchmark prints figures; it does not fail on a slow machine. docs/RELIABILITY.md holds
the latest figures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

import numpy as np
from speedmatrix._native import _core
from speedmatrix.sim import Sim


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_split_mb() -> tuple[float, float]:
    """(anonymous, file-backed) resident MB: spilled events read through mappings would be
    file-backed; what the client allocates is anonymous."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                got[line.split(":")[0]] = int(line.split()[1]) / 1024
    return got.get("RssAnon", float("nan")), got.get("RssFile", float("nan"))


def smaps() -> dict[str, float]:
    """Resident MB per mapping (address range and name), to see which one grew."""
    out: dict[str, float] = {}
    key = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                # by start address: a heap that grows keeps its start
                key = head[0].split("-")[0] + " " + (head[5] if len(head) > 5 else "[anon]")
            elif line.startswith("Rss:"):
                out[key] = int(head[1]) / 1024
    return out


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_mb() -> tuple[float, float, float]:
    """glibc's view over every arena: (bytes in use, free but held, mmapped chunks) in MB.
    Growth in use is live allocations; growth free-but-held is fragmentation."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return (float("nan"),) * 3
    return m.uordblks / 2**20, m.fordblks / 2**20, m.hblkhd / 2**20


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=600, help="window, s")
    ap.add_argument("--max-tokens", type=int, default=2000, help="per request (20 ms each)")
    ap.add_argument("--profile", default="fixed")
    ap.add_argument(
        "--spill-requests",
        type=int,
        default=None,
        help="CellSpec.spill_requests (0 = keep every request record in memory, as before)",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--smaps", action="store_true", help="name the mappings whose RSS grew after settling"
    )
    a = ap.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    body = json.dumps(
        {"prompt": "hello", "max_tokens": a.max_tokens, "ignore_eos": True, "stream": True}
    ).encode()
    samples: list[tuple[float, float, int]] = []
    with Sim(a.profile) as sim:
        sent0 = sim.state()["tokens_sent"]
        fd0 = fds()
        spec = _core.CellSpec()
        spec.url = sim.url + "/v1/completions"
        spec.bodies = [body]
        spec.concurrency = a.streams
        spec.duration_s = a.duration
        spec.idle_timeout_s = 60
        if a.spill_requests is not None:
            spec.spill_requests = a.spill_requests
        runner = _core.CellRunner(spec)
        box: dict = {}
        worker = threading.Thread(target=lambda: box.update(res=runner.run()), daemon=True)
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        worker.start()
        settle_s = min(60.0, a.duration / 6)
        maps_settled: dict[str, float] = {}
        maps_end: dict[str, float] = {}
        split: list[tuple[float, float]] = []
        heap: list[tuple[float, float, float]] = []
        while worker.is_alive():
            samples.append((time.monotonic() - t0, rss_mb(), fds()))
            split.append(rss_split_mb())
            heap.append(heap_mb())
            if a.smaps:
                if not maps_settled and samples[-1][0] >= settle_s:
                    maps_settled = smaps()
                if samples[-1][0] >= a.duration - 5:
                    maps_end = maps_end or smaps()
            worker.join(1.0)
        res = box["res"]
        if sim.wait_idle(60) is False:
            print("soak: the engine did not go idle within 60 s", file=sys.stderr)
        sent = sim.state()["tokens_sent"] - sent0
    fd_after = fds()
    counted = int(np.asarray(res.events["tokens"], dtype=np.int64).sum())
    errors = int(np.sum(res.requests["outcome"] == 3))
    after_first = [s for s in samples if s[0] >= settle_s] or samples
    rss_start, rss_end = after_first[0][1], samples[-1][1]
    growth = (rss_end - rss_start) / rss_start * 100
    figures = {
        "streams": a.streams,
        "window_s": a.duration,
        "requests": len(res.requests["outcome"]),
        "errors": errors,
        "events": len(res.events["t_ns"]),
        "rss_mb_after_settle": round(rss_start, 1),
        "rss_mb_end": round(rss_end, 1),
        "rss_growth_pct": round(growth, 2),
        "rss_mb_max_after_settle": round(max(s[1] for s in after_first), 1),
        "rss_anon_file_mb_after_settle": tuple(
            round(x, 1) for x in split[len(samples) - len(after_first)]
        ),
        "rss_anon_file_mb_end": tuple(round(x, 1) for x in split[-1]),
        "heap_used_free_mmap_mb_after_settle": tuple(
            round(x, 1) for x in heap[len(samples) - len(after_first)]
        ),
        "heap_used_free_mmap_mb_end": tuple(round(x, 1) for x in heap[-1]),
        "events_note": res.events_note or "(spilled as planned)",
        "requests_spilled": res.requests_spilled,
        "requests_note": res.requests_note
        or ("(all in memory: --spill-requests 0)" if a.spill_requests == 0 else "(as planned)"),
        "loop_lag_max_ms": round(res.loop_lag_max_ms, 1),
        "client_cpu_s": round(res.client_cpu_s, 1),
        "load_start_end": f"{load0:.2f} / {os.getloadavg()[0]:.2f}",
        "settle_s": settle_s,
        "fds_before": fd0,
        "fds_peak": max(s[2] for s in samples),
        "fds_after": fd_after,
        "tokens_counted": counted,
        "tokens_sent_by_engine": sent,
        "tokens_unaccounted": sent - counted,
        "tokens_unaccounted_per_stream": round((sent - counted) / a.streams, 2),
    }
    print(f"soak: {a.streams} streams, {a.duration:g} s window, load {os.getloadavg()[0]:.2f}")
    for k, v in figures.items():
        print(f"  {k:32s} {v}")
    print(
        f"  verdicts: RSS growth {'<' if growth < 5 else '>='} 5 %, descriptors "
        f"{'back to start' if fd_after <= fd0 else 'LEAKED'}, tokens "
        f"{'accounted' if 0 <= sent - counted <= a.streams * 4 else 'NOT accounted'}"
    )
    if a.smaps and maps_settled and maps_end:
        grew = sorted(
            (
                (maps_end.get(k, 0) - maps_settled.get(k, 0), k)
                for k in set(maps_end) | set(maps_settled)
            ),
            reverse=True,
        )
        print("  mappings that grew most after settling (MB, mapping):")
        for d, k in grew[:6]:
            print(f"    {d:+8.1f}  {k}")
    if a.json:
        # the RSS / descriptor series every 5 s, to see where memory grows
        figures["samples_t_rss_mb_fds"] = [
            (round(t, 1), round(r, 1), n) for t, r, n in samples[::5] + samples[-1:]
        ]
        Path(a.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
