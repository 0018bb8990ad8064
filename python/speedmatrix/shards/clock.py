"""A shard's clock against the driver's: its offset from ping round trips, the fastest
kept (pure; `speedmatrix.shards.driver` takes the pings).

Every time a shard records is its host's CLOCK_MONOTONIC. Before each cell the driver asks
each shard for its clock several times: a ping sent at driver time ``a``, answered with
the shard's time ``s``, back at driver time ``b``. The shard read its clock somewhere in
[a, b], so ``s - (a + b) / 2`` is its offset within ``(b - a) / 2``: the fastest round
trip bounds it best. Two processes under one kernel (the same ``boot_id``) share one
CLOCK_MONOTONIC: their offset is exactly 0, whatever the pings say.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClockOffset", "Ping", "offset_of"]


@dataclass(frozen=True)
class Ping:
    """One round trip: driver send (ns), the shard's clock (ns), driver receive (ns)."""

    sent_ns: int
    shard_ns: int
    back_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.back_ns - self.sent_ns


@dataclass(frozen=True)
class ClockOffset:
    """shard clock - driver clock (ns), known within ``bound_ns``; ``rtt_ns``: the fastest
    round trip; ``same_host``: one kernel's clock (offset exactly 0)."""

    offset_ns: int
    bound_ns: int
    rtt_ns: int
    same_host: bool = False

    def to_driver(self, shard_ns: int) -> int:
        return shard_ns - self.offset_ns

    def to_shard(self, driver_ns: int) -> int:
        return driver_ns + self.offset_ns


def offset_of(pings: list[Ping], same_host: bool = False) -> ClockOffset:
    """The offset from the fastest of ``pings`` (ValueError without a valid one: a round
    trip that came back before it was sent is a clock read out of order)."""
    valid = [p for p in pings if p.rtt_ns >= 0]
    if not valid:
        raise ValueError("no valid ping round trip")
    best = min(valid, key=lambda p: p.rtt_ns)
    if same_host:
        return ClockOffset(0, 0, best.rtt_ns, same_host=True)
    mid2 = best.sent_ns + best.back_ns  # twice the midpoint: integer arithmetic
    return ClockOffset(best.shard_ns - mid2 // 2, (best.rtt_ns + 1) // 2, best.rtt_ns)
