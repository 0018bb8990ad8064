"""The shard pool on Ray: a bounded connection to the cluster, a placement group (SPREAD:
one bundle, one shard actor, per client node where the cluster has the nodes) and the
actors (`speedmatrix.shards.actor`). Ray is an optional dependency
(``pip install speedmatrix[ray]``): it is imported here, when a run asks for shards."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from speedmatrix._native import _core
from speedmatrix.errors import SpeedmatrixError, clip
from speedmatrix.shards.actor import ShardActor, boot_id
from speedmatrix.shards.clock import ClockOffset, Ping, offset_of

__all__ = [
    "CONNECT_TIMEOUT_S",
    "PINGS",
    "PLACE_TIMEOUT_S",
    "ShardPool",
    "alive_nodes",
    "connect",
    "open_pool",
    "ray_module",
]

#: the longest a connection to the cluster may take before one line says it failed
CONNECT_TIMEOUT_S = 30.0
#: the TCP check of a HOST:PORT address before Ray is asked (a wrong address fails fast)
PROBE_TIMEOUT_S = 5.0
#: the longest the cluster may take to place the shards (and to answer their first call)
PLACE_TIMEOUT_S = 60.0
#: ping round trips per shard before each cell (the fastest is kept)
PINGS = 7


def ray_module() -> Any:
    """Ray, or one line saying how to install it."""
    try:
        # (it loads ray.util.scheduling_strategies too)
        import ray.util.placement_group  # optional: only a run with --ray needs Ray
    except ImportError:
        raise SpeedmatrixError(
            "--ray needs Ray: pip install 'speedmatrix[ray]' (on the driver and every client node)"
        ) from None
    return ray


def _probe(address: str) -> None:
    """A HOST:PORT address must accept a TCP connection within PROBE_TIMEOUT_S."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise SpeedmatrixError(f"--ray {address!r}: expected HOST:PORT (the head's GCS) or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise SpeedmatrixError(
            f"--ray {address}: nothing answers there ({clip(exc, 120)}); start the head with "
            "`ray start --head` and give its address, or use --ray auto on a cluster node"
        ) from None


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Ray's C++ client writes each failed try of a connection to the process's stderr
    (file descriptor 2): held back while connecting, so that a failure is the one line
    speedmatrix says."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Connects this process to the Ray cluster at ``address`` ("auto": the one this node
    belongs to) within ``timeout_s``; True when this call made the connection."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    if address != "auto":
        _probe(address)
    box: dict[str, Any] = {}

    def init() -> None:
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        except Exception as exc:  # noqa: BLE001 - said below in one line
            box["error"] = exc

    t = threading.Thread(target=init, name="speedmatrix-ray-init", daemon=True)
    with _quiet_stderr():
        t.start()
        t.join(timeout_s)
    if t.is_alive():
        raise SpeedmatrixError(
            f"--ray {address}: no Ray cluster answered within {timeout_s:g} s (is it a Ray "
            "head's GCS address, and the same Ray version?)"
        )
    if "error" in box and address == "auto":
        raise SpeedmatrixError(
            "--ray auto: no Ray cluster found from this node (start one with `ray start "
            f"--head`, or give --ray HOST:PORT): {clip(box['error'], 160)}"
        )
    if "error" in box:
        raise SpeedmatrixError(
            f"--ray {address}: {clip(box['error'], 200)} (is it a Ray head's GCS address, "
            "port 6379 by default, running this Ray version?)"
        )
    return True


class ShardPool:
    """K shard actors, one per placement-group bundle (SPREAD over the client nodes)."""

    def __init__(self, address: str, shards: int, cpus_per_shard: float = 1.0):
        if shards < 1:
            raise SpeedmatrixError(f"--shards {shards}: at least 1")
        self.address, self.size = address, int(shards)
        self._ray = ray_module()
        self._owned = connect(address)
        self._remove_pg = self._ray.util.remove_placement_group
        self._pg = self._ray.util.placement_group(
            [{"CPU": cpus_per_shard}] * self.size, strategy="SPREAD"
        )
        try:
            self._ray.get(self._pg.ready(), timeout=PLACE_TIMEOUT_S)
        except self._ray.exceptions.GetTimeoutError:
            res, free = self._ray.cluster_resources(), self._ray.available_resources()
            self.close()
            raise SpeedmatrixError(
                f"--shards {shards}: the Ray cluster at {address} found no room for {shards} "
                f"shard(s) of {cpus_per_shard:g} CPU in {PLACE_TIMEOUT_S:g} s (its CPUs: "
                f"{res.get('CPU', 0):g}, free: {free.get('CPU', 0):g})"
            ) from None
        self.actors = [self._actor(i, cpus_per_shard) for i in range(self.size)]
        self.nodes: list[dict[str, str]] = self._ray.get(
            [a.node.remote() for a in self.actors], timeout=PLACE_TIMEOUT_S
        )
        placed = self._ray.util.placement_group_table(self._pg).get("bundles_to_node_id") or {}
        for i, n in enumerate(self.nodes):
            n["node_id"] = str(placed.get(i, ""))
        self.boot_id = boot_id()

    def _actor(self, i: int, cpus: float) -> Any:
        cls = self._ray.remote(ShardActor)
        where = self._ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            self._pg, placement_group_bundle_index=i
        )
        return cls.options(num_cpus=cpus, max_concurrency=4, scheduling_strategy=where).remote(i)

    def offset(self, i: int, pings: int = PINGS) -> ClockOffset:
        """Shard i's clock offset now: ``pings`` round trips, the fastest kept."""
        got = []
        # a dead actor raises at once; a lost node within PLACE_TIMEOUT_S
        for _ in range(pings):
            a = int(_core.now_ns())
            s = int(self._ray.get(self.actors[i].now_ns.remote(), timeout=PLACE_TIMEOUT_S))
            got.append(Ping(a, s, int(_core.now_ns())))
        same = bool(self.boot_id) and self.nodes[i].get("boot_id") == self.boot_id
        return offset_of(got, same_host=same)

    def describe(self) -> dict[str, Any]:
        """What run.json keeps of the pool (meta.run.shards)."""
        return {
            "ray": self.address,
            "shards": self.size,
            "nodes": [n.get("host", "") for n in self.nodes],
        }

    def close(self) -> None:
        for a in getattr(self, "actors", []):
            with suppress(Exception):  # an actor already gone
                self._ray.kill(a)
        with suppress(Exception):  # a group already gone
            self._remove_pg(self._pg)
        if self._owned:
            self._ray.shutdown()


def alive_nodes() -> int:
    """The cluster's live nodes with a CPU (the default shard count)."""
    ray = ray_module()
    return sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU"))


@contextmanager
def open_pool(address: str | None, shards: int | None) -> Iterator[ShardPool | None]:
    """The shard pool a run asked for (None without ``address``), closed at the end.
    ``shards`` None: one per live node of the cluster."""
    if address is None:
        if shards not in (None, 1):
            raise SpeedmatrixError("--shards needs --ray ADDRESS|auto")
        yield None
        return
    owned = connect(address)
    try:
        pool = ShardPool(address, shards or max(alive_nodes(), 1))
        try:
            yield pool
        finally:
            pool.close()
    finally:
        if owned:
            ray_module().shutdown()
