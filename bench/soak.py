"""Soak benchmark of the client core: many streams for a long window against the built-in
engine, watching the client's memory and descriptors and accounting for every token.

    PYTHONPATH=python python3 bench/soak.py [--streams 1024] [--duration 600] [--max-tokens 2000]
        [--spill-requests N] [--unpaced] [--no-end-of-cell] [--smaps] [--json FILE]

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
  at most one event's worth per stream;
  the end of the cell, as a run does it (the records of the result, the verdict's figures
  from summarize_cell, its latency distributions, coalesced_share, the records saved as
  .npz, the Parquet export), RSS sampled every 20 ms: the peak of each step and of them all, against the
  in-window peak (target: within 1.5x; the events are read from their spill mappings, never
  copied whole, docs/RELIABILITY.md).
A benchmark prints figures; it does not fail on a slow machine. docs/RELIABILITY.md holds
the latest figures.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

import tempfile
from types import SimpleNamespace

import numpy as np

# what a run has loaded before its first cell (the end of a cell uses them): imported before
# the window, so that the in-window RSS counts their code as a run's does
import pandas as pd
import pyarrow.parquet  # noqa: F401
from speedmatrix import export, figures, latency, runfile
from speedmatrix._native import _core
from speedmatrix.records import Records
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


class PeakRss:
    """The largest RSS seen while a step runs, sampled every 20 ms on a thread."""

    def __init__(self) -> None:
        self.peak = rss_mb()
        self.peak_anon = rss_split_mb()[0]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb())
            self.peak_anon = max(self.peak_anon, rss_split_mb()[0])

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_mb())
        self.peak_anon = max(self.peak_anon, rss_split_mb()[0])


def end_of_cell(held: dict) -> dict[str, float]:
    """The end of a measured cell as `speedmatrix.sweep` runs it, step by step: peak RSS (MB)
    and seconds of each, and their overall peak. Takes the cell's result out of ``held``: as
    in a run, the records (and the spill mappings under them) are released once saved,
    before the export."""
    out: dict[str, float] = {
        "rss_mb_before_end_of_cell": round(rss_mb(), 1),
        "rss_anon_mb_before_end_of_cell": round(rss_split_mb()[0], 1),
    }
    with tempfile.TemporaryDirectory(prefix="soak-") as d:
        box: dict = {}
        qs = figures.tbt_levels(figures.DEFAULT_PERCENTILES)
        rec = Records.from_result(held.pop("res"))
        t0, t1 = int(rec.window_start_ns), int(rec.window_end_ns)
        steps = {
            # as decode_cell: one summary, its TBT quantiles read by the latency distributions
            "summarize_cell": lambda: box.update(
                fig=_core.summarize_cell(
                    rec.requests, rec.events, t0, t1, 1.0, t0, int(rec.ramp_start_ns), qs
                )
            ),
            "latency": lambda: latency.cell_latency(
                rec.requests, rec.events, t0, t1, core=box["fig"]
            ),
            "coalesced_share": lambda: latency.coalesced_share(rec.requests, rec.events, t0, t1),
            "save_records": lambda: box.update(
                rel=runfile.save_records(
                    d, "soak", rec.requests, rec.events, dict(rec.metrics), stamps=rec.stamps()
                )
            ),
            "release_records": lambda: release(),
            "parquet_export": lambda: export.write_parquet(
                SimpleNamespace(
                    cells=pd.DataFrame({"id": ["soak"]}),
                    doc={
                        "cells": [
                            {
                                "phase": "decode",
                                "context": 0,
                                "concurrency": 1,
                                "records": box["rel"],
                            }
                        ]
                    },
                    path=Path(d),
                    _records_cache={},
                    records=lambda _cid: Records.from_loaded(runfile.load_records(d, box["rel"])),
                ),
                d,
            ),
        }

        def release() -> None:
            nonlocal rec
            rec = None
            gc.collect()

        peak = peak_anon = 0.0
        for name, step in steps.items():
            t = time.monotonic()
            with PeakRss() as p:
                step()
            # RSS, and of it the anonymous memory: the spill mappings' pages that a step
            # reads are file-backed (counted in RSS, dropped by the kernel under pressure)
            out[f"end_{name}_peak_mb"] = round(p.peak, 1)
            out[f"end_{name}_peak_anon_mb"] = round(p.peak_anon, 1)
            out[f"end_{name}_s"] = round(time.monotonic() - t, 2)
            peak, peak_anon = max(peak, p.peak), max(peak_anon, p.peak_anon)
        out["end_of_cell_peak_mb"] = round(peak, 1)
        out["end_of_cell_peak_anon_mb"] = round(peak_anon, 1)
    return out


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=600, help="window, s")
    ap.add_argument("--max-tokens", type=int, default=2000, help="per request (20 ms each)")
    ap.add_argument("--profile", default="fixed")
    ap.add_argument(
        "--unpaced", action="store_true", help="the engine sends as fast as it can (no 20 ms ITL)"
    )
    ap.add_argument(
        "--spill-requests",
        type=int,
        default=None,
        help="CellSpec.spill_requests (0 = keep every request record in memory, as before)",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--no-end-of-cell",
        dest="end_of_cell",
        action="store_false",
        help="skip the end-of-cell steps (summary, latency, .npz, Parquet) and their peak RSS",
    )
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
    with Sim(a.profile, unpaced=a.unpaced) as sim:
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
        counted = int(np.asarray(res.events["tokens"], dtype=np.int64).sum())
        got = SimpleNamespace(
            requests=len(res.requests["outcome"]),
            errors=int(np.sum(res.requests["outcome"] == 3)),
            events=len(res.events["t_ns"]),
            events_note=res.events_note,
            requests_spilled=res.requests_spilled,
            requests_note=res.requests_note,
            loop_lag_max_ms=res.loop_lag_max_ms,
            client_cpu_s=res.client_cpu_s,
        )
        del res
        end = end_of_cell(box) if a.end_of_cell else {}
        box.clear()
        if sim.wait_idle(60) is False:
            print("soak: the engine did not go idle within 60 s", file=sys.stderr)
        sent = sim.state()["tokens_sent"] - sent0
    fd_after = fds()
    errors = got.errors
    after_first = [s for s in samples if s[0] >= settle_s] or samples
    rss_start, rss_end = after_first[0][1], samples[-1][1]
    growth = (rss_end - rss_start) / rss_start * 100
    figures = {
        "streams": a.streams,
        "window_s": a.duration,
        "requests": got.requests,
        "errors": errors,
        "events": got.events,
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
        "events_note": got.events_note or "(spilled as planned)",
        "requests_spilled": got.requests_spilled,
        "requests_note": got.requests_note
        or ("(all in memory: --spill-requests 0)" if a.spill_requests == 0 else "(as planned)"),
        "loop_lag_max_ms": round(got.loop_lag_max_ms, 1),
        "client_cpu_s": round(got.client_cpu_s, 1),
        "load_start_end": f"{load0:.2f} / {os.getloadavg()[0]:.2f}",
        "settle_s": settle_s,
        "fds_before": fd0,
        "fds_peak": max(s[2] for s in samples),
        "fds_after": fd_after,
        "tokens_counted": counted,
        "tokens_sent_by_engine": sent,
        "tokens_unaccounted": sent - counted,
        "tokens_unaccounted_per_stream": round((sent - counted) / a.streams, 2),
        "rss_mb_max_in_window": round(max(s[1] for s in samples), 1),
        "rss_anon_mb_max_in_window": round(max(x[0] for x in split), 1),
        **end,
    }
    if end:
        figures["end_of_cell_over_in_window"] = round(
            end["end_of_cell_peak_mb"] / figures["rss_mb_max_in_window"], 2
        )
        figures["end_of_cell_anon_over_in_window"] = round(
            end["end_of_cell_peak_anon_mb"] / figures["rss_anon_mb_max_in_window"], 2
        )
    print(f"soak: {a.streams} streams, {a.duration:g} s window, load {os.getloadavg()[0]:.2f}")
    for k, v in figures.items():
        print(f"  {k:32s} {v}")
    print(
        f"  verdicts: RSS growth {'<' if growth < 5 else '>='} 5 %, descriptors "
        f"{'back to start' if fd_after <= fd0 else 'LEAKED'}, tokens "
        f"{'accounted' if 0 <= sent - counted <= a.streams * 4 else 'NOT accounted'}"
        + (
            f", end-of-cell peak {figures['end_of_cell_over_in_window']}x the in-window peak "
            f"({'within' if figures['end_of_cell_over_in_window'] <= 1.5 else 'OVER'} 1.5x; "
            f"anonymous {figures['end_of_cell_anon_over_in_window']}x)"
            if end
            else ""
        )
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
