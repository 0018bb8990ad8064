"""What a verdict is judged by: the thresholds (`Rules`) and the engine facts (`EngineFacts`).

Both are saved in run.json ``meta["verdict"]``, so `speedmatrix recompute` judges a
saved run by the same ones (or by others, on request).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from speedmatrix.verdict.cache import CACHE_HIT_TOLERANCE

__all__ = ["EngineFacts", "Rules"]


@dataclass(frozen=True)
class Rules:
    """The thresholds of the status and flag rules (DESIGN.md "Status")."""

    #: a cell is `queued` when, once its first wave of N requests was admitted, on
    #: average at least this many requests waited: the server's waiting count when it
    #: has metrics, else requests in flight without streaming (client side)
    queue_gap_requests: float = 0.5
    #: the client is the bottleneck (`client_bound`) when its thread used this share of a core
    client_bound_cpu_share: float = 0.85
    #: `client_near_limit` when the client's roofline on this host (`speedmatrix selftest`)
    #: is less than this many times what the cell made it take in (its ``client_headroom``)
    client_near_limit_headroom: float = 2.0
    #: runs saved before steady-state windows (no ramp_start_ns): a first wave that took
    #: more than this share of the window to stream (or never all streamed) is flagged
    #: `long_ramp`. Newer runs are flagged when the ramp cap opened the window.
    ramp_share: float = 0.2
    #: a cell's median TTFT counts only the requests that got a first token; when more
    #: than this share of the requests sent in the window were still waiting at its end,
    #: longer than that median, the median reads low: `ttft_unserved`
    ttft_unserved_share: float = 0.05
    #: a cell is `error` when more than this share of its started requests failed
    error_threshold: float = 0.05
    #: `server_running_mismatch` when the server's mean running count exceeds
    #: N x factor + slack (another client is using the server)
    running_mismatch_factor: float = 1.1
    running_mismatch_slack: float = 0.5
    #: `coalesced_delivery` when more than this share of the window's token events arrived
    #: in a socket read that carried another event too (the cell's ``coalesced_share``):
    #: a stream read once per token delivers nearly none that way, a server or proxy that
    #: flushes in bursts most of them
    coalesced_share_max: float = 0.25
    #: `cache_hit_mismatch` when the delivered cached fraction is more than this far from
    #: the asked one (`speedmatrix.verdict.cache`)
    cache_hit_tolerance: float = CACHE_HIT_TOLERANCE
    #: `sessions_late` when a sessions cell's later turns were sent, at p99, more than this
    #: many ms after they were due (their answer's end + the think time): the Python feeder
    #: that builds each next turn (GIL, a tokenize round trip) shifted the load the server
    #: saw. 50 ms is several decode steps and about a cached turn's TTFT on a real engine,
    #: while a healthy feeder adds about a millisecond (docs/metrics.md "Sessions")
    sessions_late_ms: float = 50.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Rules:
        """Rules from a saved dict; unknown keys are ignored, missing ones take defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (data or {}).items() if k in names})

    def replace(self, **changes: Any) -> Rules:
        """These rules with some thresholds changed; unknown names raise KeyError."""
        names = {f.name for f in fields(self)}
        bad = sorted(set(changes) - names)
        if bad:
            raise KeyError(f"no rule {bad[0]!r} (rules: {', '.join(sorted(names))})")
        return Rules(**{**asdict(self), **{k: float(v) for k, v in changes.items()}})


@dataclass(frozen=True)
class EngineFacts:
    """What the verdict needs to know about the server, saved in run.json meta["verdict"]."""

    #: the engine generates exactly max_tokens (else `output_not_forced`)
    output_forced: bool = True
    #: Prometheus gauge names: running and waiting requests, KV usage (None = not exposed)
    metric_running: str | None = None
    metric_waiting: str | None = None
    metric_kv_usage: str | None = None
    #: the engine's preemption counter (`speedmatrix.verdict.preemption`)
    metric_preemptions: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EngineFacts:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})

    @classmethod
    def of_target(cls, target: Any) -> EngineFacts:
        """The facts of a discovered `speedmatrix.adapters.Target`."""
        m = target.metrics
        has = m is not None and m.available
        return cls(
            output_forced=bool(target.output.forced),
            metric_running=m.running if has else None,
            metric_waiting=m.waiting if has else None,
            metric_kv_usage=m.kv_usage if has else None,
            metric_preemptions=getattr(m, "preemptions", None) if has else None,
        )

    def metric_names(self) -> list[str]:
        names = (self.metric_running, self.metric_waiting, self.metric_kv_usage)
        return [n for n in (*names, self.metric_preemptions) if n]
