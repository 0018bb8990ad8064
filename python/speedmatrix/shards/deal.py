"""A cell's CellSpec dealt over K shards, and carried across Ray as plain fields (pure).

As the core deals its own loops (docs/SCALE.md). Closed loop: shard i of K runs the
global slots k = i, i + K, i + 2K, ...; global slot k sends ``bodies[k % B]`` as with one
client, so shard i's local slot j is given that body as its own ``bodies[j]``. Warm-up
bodies and a ``max_requests`` budget are dealt the same way. A cell of fewer slots than
shards runs on as many shards as it has slots (all of its load, never less). Open loop:
the cell's one arrival schedule (the core's pacer, `_core.arrival_offsets_ns`) dealt
round-robin, shard i replaying arrivals i, i + K, ... at their global times; arrival k
sends ``bodies[k % B]``. An open loop behind a ``max_concurrency`` gate (one FIFO queue)
is not dealt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedmatrix._native import _core

__all__ = [
    "Dealt",
    "build_spec",
    "deal",
    "deal_closed",
    "deal_open",
    "shards_for",
    "spec_fields",
    "unsharded_why",
]


def spec_fields(spec: Any) -> dict[str, Any]:
    """The CellSpec's fields as plain values (bodies as bytes). The API key reads back as
    "***" and is left out: the driver sends it apart (`build_spec`)."""
    names = [
        n
        for n in dir(_core.CellSpec)
        if not n.startswith("_") and isinstance(getattr(_core.CellSpec, n), property)
    ]
    out = {n: getattr(spec, n) for n in names if n != "api_key"}
    out["api"] = out["api"].name  # an enum name pickles anywhere
    return out


def build_spec(fields: dict[str, Any], api_key: str | None = None) -> Any:
    """A CellSpec from `spec_fields`' plain values (and the key, when the server needs one)."""
    spec = _core.CellSpec()
    for name, value in fields.items():
        setattr(spec, name, getattr(_core.ApiKind, value) if name == "api" else value)
    if api_key:
        spec.api_key = api_key
    return spec


@dataclass(frozen=True)
class Dealt:
    """Shard ``index`` of ``of``: its local slot/warm-up/body j is global i + j·K
    (window bodies modulo ``bodies``, the cell's body count)."""

    index: int
    of: int
    bodies: int


def shards_for(fields: dict[str, Any], shards: int) -> int:
    """How many shards a cell runs on: an open loop on all; a closed loop never on more
    than its slots (nor its ``max_requests`` budget, when it has one)."""
    if fields.get("mode", "closed") == "open":
        return max(1, int(shards))
    k = min(int(shards), int(fields["concurrency"]))
    budget = int(fields.get("max_requests", 0))
    return max(1, min(k, budget) if budget > 0 else k)


def unsharded_why(fields: dict[str, Any]) -> str | None:
    """Why a cell cannot be dealt over shards (None: it can)."""
    if fields.get("mode", "closed") == "open" and int(fields.get("max_concurrency", 0)) > 0:
        return "an open loop behind --max-concurrency (one queue) is not dealt over shards"
    if fields.get("mode", "closed") == "open" and fields.get("schedule_ns"):
        return "a replayed schedule (a trace) is not dealt over shards yet"
    return None


def _share(total: int, i: int, k: int) -> int:
    """Items i, i + k, ... of ``total``: how many shard i gets."""
    return len(range(i, total, k))


def deal(fields: dict[str, Any], shards: int) -> list[tuple[Dealt, dict[str, Any]]]:
    """Each shard's part of a cell: (its dealing, its CellSpec fields); ValueError when
    the cell cannot be dealt (`unsharded_why`)."""
    why = unsharded_why(fields)
    if why and shards == 1:  # one shard runs the cell whole, as one process would
        return [(Dealt(0, 1, len(fields["bodies"])), _shard_part(fields, 1))]
    if why:
        raise ValueError(why)
    if fields.get("mode", "closed") == "open":
        return deal_open(fields, shards)
    return deal_closed(fields, shards)


def _shard_part(fields: dict[str, Any], shards: int) -> dict[str, Any]:
    part = dict(fields)
    if shards > 1:  # each shard's own precision stop would end its window alone
        part["precision"] = 0.0
    # the server's metrics are sampled once, by the driver
    part["metrics_url"] = ""
    return part


def deal_open(fields: dict[str, Any], shards: int) -> list[tuple[Dealt, dict[str, Any]]]:
    """Each shard's part of an open-loop cell: arrivals i, i + K, ... of its one schedule."""
    k = shards_for(fields, shards)
    times = list(
        _core.arrival_offsets_ns(
            str(fields["arrival"]),
            float(fields["rate_per_s"]),
            float(fields["gamma_shape"]),
            int(fields["seed"]),
            float(fields["duration_s"]),
        )
    )
    if not times:  # no arrival in the window: one shard runs the cell as it is
        return [(Dealt(0, 1, len(fields["bodies"])), _shard_part(fields, 1))]
    k = min(k, len(times))  # never a shard without an arrival
    bodies = list(fields["bodies"])
    out = []
    for i in range(k):
        part = _shard_part(fields, k)
        part["schedule_ns"] = times[i::k]
        # local arrival j is global arrival i + jK: it sends bodies[(i + jK) % B]
        part["bodies"] = [bodies[(i + j * k) % len(bodies)] for j in range(len(bodies))]
        part["warmup_bodies"] = list(fields["warmup_bodies"])[i::k]
        out.append((Dealt(i, k, len(bodies)), part))
    return out


def deal_closed(fields: dict[str, Any], shards: int) -> list[tuple[Dealt, dict[str, Any]]]:
    """Each shard's part of a closed-loop cell: (its dealing, its CellSpec fields)."""
    k = shards_for(fields, shards)
    n = int(fields["concurrency"])
    bodies = list(fields["bodies"])
    warm = list(fields["warmup_bodies"])
    budget = int(fields.get("max_requests", 0))
    out = []
    for i in range(k):
        part = _shard_part(fields, k)
        slots = _share(n, i, k)
        part["concurrency"] = slots
        part["bodies"] = [bodies[(i + j * k) % len(bodies)] for j in range(slots)]
        part["warmup_bodies"] = warm[i::k]
        if budget > 0:
            part["max_requests"] = _share(budget, i, k)
        out.append((Dealt(i, k, len(bodies)), part))
    return out
