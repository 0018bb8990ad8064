"""Running a prefill-interference cell (`speedmatrix.trafficplan`): N streams decode while
one cold C-token prompt arrives every T seconds, as one open-loop schedule.

Arrivals 0..N-1 (at 0) send the decoders' bodies, arrival N + k (at (k + 1) x T, while
before the window's end) the k-th prefill's: a unique C-token prompt with one output token.
The window is the schedule's [0, D); at its end every decoder still streaming is cut (no
drain): the figures read only what arrived inside it (`speedmatrix.verdict.interference`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["configure", "prefill_count", "schedule_ns"]


def prefill_count(every_s: float, duration_s: float) -> int:
    """Prefills due inside a window of ``duration_s``: at every_s, 2 every_s, ... < D."""
    if every_s <= 0:
        return 0
    count = int(duration_s / every_s)
    return count - 1 if count * every_s >= duration_s else count


def schedule_ns(streams: int, every_s: float, duration_s: float) -> list[int]:
    """The send times: the decoders' at 0, then each prefill's."""
    step_ns = round(every_s * 1e9)
    return [0] * streams + [(k + 1) * step_ns for k in range(prefill_count(every_s, duration_s))]


def configure(spec: Any, streams: int, every_s: float, duration_s: float) -> None:
    """Turns a `_core.CellSpec` whose bodies are the decoders' then the prefills' (in that
    order, as many as `schedule_ns` has arrivals) into an interference cell's."""
    spec.mode = "open"
    spec.schedule_ns = schedule_ns(streams, every_s, duration_s)
    spec.duration_s = float(duration_s)
    spec.drain_timeout_s = 0.0
    spec.max_concurrency = 0
    spec.rate_per_s = len(spec.schedule_ns) / float(duration_s)
