"""How many requests the server runs at once, where it does not publish it (vLLM's
``max_num_seqs``): from the launch command the user gave, or from a short load probe.

- :func:`max_running_from_launch`: the engine's own flag in a launch command
  (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``, llama.cpp
  ``-np``/``--parallel``, TGI ``--max-batch-size``); pure.
- :func:`read_plateau`: the verdict of a probe from its metric samples; pure.
- :func:`probe_max_running`: sends K small requests at once and samples the server's
  running and waiting gauges until they finish. A running count that stops at S while
  requests wait (and the KV cache is not full) is the cap S; all K running at once says
  only "at least K". A reading that saw neither (the plateau lasted fewer than two
  samples: a busy host, a fast server) is taken again once with requests four times as
  long, so that the plateau spans more samples. A minute at most, all tries together.
- :func:`learn_max_running`: the order the sweep uses (a given ``--max-running`` or a
  probed figure is kept; then the launch command; then the probe, only when some cell's
  verdict depends on it).
"""

from __future__ import annotations

import itertools
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any

from speedmatrix.adapters.llamacpp import LAYOUT_UNKNOWN, layout_from_launch
from speedmatrix.adapters.probe import parse_prometheus

__all__ = [
    "LAUNCH_FLAGS",
    "Plateau",
    "learn_max_running",
    "max_running_from_launch",
    "probe_max_running",
    "read_plateau",
]

#: the flag that sets the running cap, per engine (adapter name)
LAUNCH_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--max-num-seqs",),
    "sglang": ("--max-running-requests",),
    "llamacpp": ("-np", "--parallel"),
    "tgi": ("--max-batch-size",),
}
#: requests of the probe: a few prompt tokens, this many output tokens (one KV block or
#: two); the second try's, taken only when the first read nothing, keeps the plateau
#: (S running, the rest waiting) four times as long
PROBE_OUTPUT_TOKENS = (96, 384)
PROBE_POLL_S = 0.05
PROBE_LIMIT_S = 60.0


def max_running_from_launch(engine: str, command: str | None) -> tuple[int | None, str]:
    """(cap, the flag as written) from ``command``; (None, "") when it does not say. The
    last occurrence wins, as argparse does."""
    flags = LAUNCH_FLAGS.get(engine)
    if not flags or not command:
        return None, ""
    try:
        words = shlex.split(command, comments=False)
    except ValueError:
        words = command.split()
    found: tuple[int | None, str] = (None, "")
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in flags:
            continue
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        if value.isdigit() and int(value) > 0:
            found = (int(value), f"{name} {value}")
    return found


@dataclass(frozen=True)
class Plateau:
    """A probe's reading: ``cap`` the running cap it proved (None = not proved),
    ``at_least`` a lower bound when every request ran at once, ``detail`` why, ``peak``
    the most requests seen running (None: no sample)."""

    cap: int | None
    at_least: int | None
    detail: str
    peak: int | None = None

    @property
    def inconclusive(self) -> bool:
        """The server was seen running requests, but neither a cap nor all of them at once."""
        return self.peak is not None and self.cap is None and self.at_least is None


def read_plateau(
    samples: list[tuple[float, float | None, float | None]], sent: int, kv_full: bool = False
) -> Plateau:
    """Reads (running, waiting, kv_usage) samples of a probe of ``sent`` requests.

    The cap is proved when the running count held one value S < sent in two samples in
    a row while requests waited, never rose above it, and the KV cache was not full (a
    full cache also keeps requests waiting: that is not the cap)."""
    running = [r for r, _w, _k in samples if r is not None]
    if not running:
        return Plateau(None, None, "the probe saw no running count")
    peak = int(max(running))
    held = [
        (a, b)
        for (a, wa, ka), (b, wb, kb) in itertools.pairwise(samples)
        if a is not None
        and a == b == peak
        and (wa or 0) > 0
        and (wb or 0) > 0
        and not (kv_full or (ka or 0) >= 0.99 or (kb or 0) >= 0.99)
    ]
    if peak < sent and held:
        waited = int(max((w or 0) for _r, w, _k in samples))
        return Plateau(
            peak,
            None,
            f"load probe: {sent} requests at once, at most {peak} ran while up to {waited} waited",
            peak,
        )
    if peak >= sent:
        return Plateau(None, sent, f"load probe: all {sent} requests ran at once", peak)
    return Plateau(
        None, None, f"load probe: running reached {peak} of {sent}, no plateau held", peak
    )


def probe_max_running(target: Any, requests: int, *, limit_s: float = PROBE_LIMIT_S) -> Plateau:
    """Sends ``requests`` small completions at once to ``target`` (a discovered Target)
    and reads its running/waiting gauges until they finish; an inconclusive reading is
    taken again with the longer requests of `PROBE_OUTPUT_TOKENS`. ``limit_s`` bounds all
    tries together; the reading returned is the last one's, its detail naming the tries."""
    if target.metrics_url is None or not target.model:
        return Plateau(None, None, "no metrics: the load probe cannot see the server")
    deadline = time.monotonic() + limit_s
    readings: list[Plateau] = []
    for output_tokens in PROBE_OUTPUT_TOKENS:
        if readings and (not readings[-1].inconclusive or time.monotonic() >= deadline):
            break
        readings.append(_probe_once(target, requests, output_tokens, deadline))
    last = readings[-1]
    if len(readings) == 1:
        return last
    tries = ", then ".join(f"{n} output tokens" for n in PROBE_OUTPUT_TOKENS[: len(readings)])
    return Plateau(last.cap, last.at_least, f"{last.detail} (tries: {tries})", last.peak)


def _probe_once(target: Any, requests: int, output_tokens: int, deadline: float) -> Plateau:
    """One try of `probe_max_running`: ``requests`` completions of ``output_tokens``."""
    url = target.metrics_url
    limit_s = max(1.0, deadline - time.monotonic())
    body = {
        "model": target.model,
        "prompt": "a b c",
        **target.output.fields("completions", output_tokens),
    }
    done = threading.Event()
    left = [requests]
    lock = threading.Lock()

    def one() -> None:
        try:
            with target.client(timeout_s=limit_s) as client:
                client.post_json("/v1/completions", body)
        except Exception:  # noqa: BLE001, S110 - a failed request only weakens the reading
            pass
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(requests)]
    for t in threads:
        t.start()
    samples: list[tuple[float, float | None, float | None]] = []
    with target.client(timeout_s=5.0) as client:
        while not done.is_set() and time.monotonic() < deadline:
            try:
                load = target.metrics.reduce(parse_prometheus(client.get_text(url)))
            except Exception:  # noqa: BLE001 - a missed sample is skipped
                load = None
            if load is not None and load.get("running") is not None:
                samples.append((load["running"], load.get("waiting"), load.get("kv_usage")))
            done.wait(PROBE_POLL_S)
    for t in threads:
        t.join(timeout=1.0)
    return read_plateau(samples, requests)


def learn_max_running(
    target: Any, launch_command: str | None = None, probe_requests: int = 0
) -> str | None:
    """Fills ``target``'s max running where it is missing: from the launch command
    (source ``given``), else, when ``probe_requests`` > 1, from a load probe of that many
    requests (source ``probed``). Returns a note for the run's warnings, or None."""
    cap = target.capacity.get("max_running")
    if cap is not None and cap.value is not None:
        return None
    value, flag = max_running_from_launch(str(target.engine), launch_command)
    if value:
        target.set_capacity("max_running", value, "given", f"launch command {flag}")
        return None
    if probe_requests < 2 or not (target.metrics.available and target.metrics.waiting):
        return None
    reading = probe_max_running(target, probe_requests)
    if reading.cap:
        target.set_capacity("max_running", reading.cap, "probed", reading.detail)
        return None
    if reading.at_least:
        # every request of the probe ran: for a matrix whose N stay below that, N runs
        target.info["max_running_at_least"] = reading.at_least
        target.info["max_running_detail"] = reading.detail
        return None
    return f"max running not found ({reading.detail})"


def learn_layout(target: Any, launch_command: str | None) -> None:
    """llama.cpp: a KV layout discovery could not read, from the launch command."""

    layout = target.info.get("kv_layout") if isinstance(target.info, dict) else None
    if str(target.engine) != "llamacpp" or not isinstance(layout, dict):
        return
    if layout.get("unified") is not None:
        return
    given = layout_from_launch(launch_command)
    if given is None:
        return
    target.info["kv_layout"] = given
    if LAYOUT_UNKNOWN in target.warnings:
        target.warnings.remove(LAYOUT_UNKNOWN)
    ctx, slots = target.context_length, target.max_running
    kv = target.capacity.get("kv_tokens")
    if ctx and slots and (kv is None or kv.source != "given"):
        pool = ctx if given["unified"] else ctx * slots
        target.set_capacity("kv_tokens", pool, "given", given["source"].removeprefix("given: "))
