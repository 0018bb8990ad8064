"""`_core.coalesced_share` read in passes over the event columns (the transport's order:
bounded memory) gives the figure of the derivation it replaced (a copy sorted by request and
time, 16 bytes an event) exactly, on synthetic records of every kind of stream; so does the
sorted copy it still makes for events in any other order."""

from __future__ import annotations

import math

import numpy as np
import pytest
from speedmatrix._native import _core

DELIVERY_NS = 1_000_000  # stats.hpp kDeliveryNs
T0, T1 = 50_000_000, 1_900_000_000


def _median(values: list[float]) -> float:
    """stats.cpp percentile(v, 0.5): linear interpolation, as the core computes it."""
    v = sorted(values)
    pos = 0.5 * (len(v) - 1)
    lo = math.floor(pos)
    frac = pos - lo
    return v[lo] if frac == 0 or lo + 1 >= len(v) else v[lo] + frac * (v[lo + 1] - v[lo])


def _old_coalesced_share(req: dict, ev: dict, t0: int, t1: int) -> float:
    """The derivation before this change (stats.cpp at 19a91a8), line by line: the window's
    token events of window requests sorted by (request, t_ns); per stream its deliveries
    (events less than kDeliveryNs after the delivery's first), its pace (the gap between
    deliveries' first events over the later one's events) and its median; an event came with
    another when it followed the previous one of its delivery in under a quarter of that
    median (at the same instant when the stream has one delivery)."""
    phase = req["phase"]
    evs = sorted(
        (int(q), int(t))
        for q, t, k in zip(ev["request"], ev["t_ns"], ev["tokens"])
        if k > 0 and phase[q] == 1 and t0 <= t <= t1
    )
    if not evs:
        return math.nan
    together = 0
    i = 0
    while i < len(evs):
        end = i
        while end < len(evs) and evs[end][0] == evs[i][0]:
            end += 1
        deliveries = []
        d = i
        while d < end:
            k = d + 1
            while k < end and evs[k][1] - evs[d][1] < DELIVERY_NS:
                k += 1
            deliveries.append((d, k))
            d = k
        pace = [
            float(evs[a][1] - evs[deliveries[n - 1][0]][1]) / float(b - a)
            for n, (a, b) in enumerate(deliveries)
            if n > 0
        ]
        median = _median(pace) if pace else math.nan
        for a, b in deliveries:
            prev_counted = False
            for e in range(a + 1, b):
                inner = float(evs[e][1] - evs[e - 1][1])
                burst = inner == 0.0 if math.isnan(median) else inner < 0.25 * median
                if burst:
                    together += 1 if prev_counted else 2
                prev_counted = burst
        i = end
    return together / len(evs)


def _stream(rng: np.random.Generator, kind: str, start: int) -> list[tuple[int, int]]:
    """(t_ns, tokens) of one stream's events."""
    out = []
    t = start
    n = int(rng.integers(1, 60))
    for _ in range(n):
        if kind == "paced":  # one token a read, 5-40 ms apart
            t += int(rng.integers(5, 40)) * 1_000_000
            out.append((t, 1))
        elif kind == "bursts":  # a burst of 2-6 events in one read, or in pieces us apart
            t += int(rng.integers(20, 90)) * 1_000_000
            pieces = bool(rng.integers(0, 2))
            for j in range(int(rng.integers(2, 7))):
                out.append((t + (j * int(rng.integers(1, 400)) * 1000 if pieces else 0), 1))
        elif kind == "fast":  # one token a read, faster than a read per ms
            t += int(rng.integers(150_000, 400_000))
            out.append((t, int(rng.integers(1, 3))))
        else:  # mixed: reads with ties, empty chunks (0 tokens), irregular gaps
            t += int(rng.integers(0, 3)) * int(rng.integers(100_000, 30_000_000))
            out.append((t, int(rng.integers(0, 3))))
    return out


def _records(seed: int, n_req: int = 80) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    kinds = ["paced", "bursts", "fast", "mixed"]
    rows = []
    for q in range(n_req):
        start = int(rng.integers(0, 1_500_000_000))
        rows += [(t, q, k) for t, k in _stream(rng, kinds[q % 4], start)]
    rows.sort(key=lambda r: r[0])  # the transport's order: time never goes back
    ev = {
        "t_ns": np.array([r[0] for r in rows], np.int64),
        "request": np.array([r[1] for r in rows], np.int32),
        "tokens": np.array([r[2] for r in rows], np.int32),
    }
    req = {
        "sent_ns": np.zeros(n_req, np.int64),
        "first_token_ns": np.zeros(n_req, np.int64),
        "done_ns": np.full(n_req, 2_000_000_000, np.int64),
        "outcome": np.ones(n_req, np.uint8),
        "phase": np.where(np.arange(n_req) % 7 == 3, 0, 1).astype(np.uint8),  # some warm-up
        "prompt_tokens": np.zeros(n_req, np.int64),
    }
    return req, ev


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("order", ["transport", "shuffled"])
def test_the_streamed_share_is_the_old_derivations(seed: int, order: str) -> None:
    req, ev = _records(seed)
    if order == "shuffled":  # not the transport's order: the sorted copy
        perm = np.random.default_rng(seed + 100).permutation(len(ev["t_ns"]))
        ev = {k: v[perm].copy() for k, v in ev.items()}
        assert (np.diff(ev["t_ns"]) < 0).any()
    old = _old_coalesced_share(req, ev, T0, T1)
    assert 0.05 < old < 0.95  # bursts and paced streams both present: not a trivial figure
    assert _core.coalesced_share(req, ev, T0, T1) == old


def test_the_share_of_an_empty_window_is_nan() -> None:
    req, ev = _records(1)
    assert math.isnan(_core.coalesced_share(req, ev, 10, 20))
    assert math.isnan(_old_coalesced_share(req, ev, 10, 20))


def test_the_share_holds_no_copy_of_the_events() -> None:
    """3 M token events (the 512-stream, 120 s soak's count), requests turning over in 512
    slots: the sorted copy held 16 bytes an event (48 MB, over the 40 MB the summary's
    test allows); the streamed passes hold per-request state and the paces of the streams
    open at one time. Peak RSS (VmHWM, reset first) over the RSS before."""
    slots, per_req, waves = 512, 500, 12
    n_req = slots * waves
    q = np.repeat(np.arange(n_req, dtype=np.int32), per_req)
    step = np.random.default_rng(7).integers(15_000_000, 25_000_000, (n_req, per_req))
    # request i is sent in wave i // slots (10 s apart), its events 15-25 ms apart
    start = (np.arange(n_req) // slots) * 10_000_000_000 + (np.arange(n_req) % slots) * 10_000
    t = (start[:, None] + np.cumsum(step, axis=1)).ravel()
    order = np.argsort(t, kind="stable")
    ev = {
        "request": q[order],
        "t_ns": t[order].astype(np.int64),
        "tokens": np.ones(q.size, np.int32),
    }
    del q, t, step, order
    req = {
        "sent_ns": np.zeros(n_req, np.int64),
        "first_token_ns": np.zeros(n_req, np.int64),
        "done_ns": np.full(n_req, 130_000_000_000, np.int64),
        "outcome": np.ones(n_req, np.uint8),
        "phase": np.ones(n_req, np.uint8),
        "prompt_tokens": np.zeros(n_req, np.int64),
    }

    def status_mb(key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith(key)) / 1024

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("this kernel cannot reset the peak RSS")
    before = status_mb("VmRSS")
    share = _core.coalesced_share(req, ev, 0, 130_000_000_000)
    grew = status_mb("VmHWM") - before
    assert share == 0.0  # one token a read, 15-25 ms apart: nothing came together
    assert grew < 40, f"coalesced_share grew the process by {grew:.0f} MB for 3 M events"
