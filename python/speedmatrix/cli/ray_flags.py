"""The `run` flags of scale-out on Ray (`speedmatrix.shards`, docs/SCALE.md): ``--ray
ADDRESS|auto`` and ``--shards K``. They choose where the client runs, not what the matrix
is: they are not saved in the matrix (run.json keeps them in meta.run.shards)."""

from __future__ import annotations

import argparse

from speedmatrix.cliargs import UsageError, positive_int

__all__ = ["add_ray_flags", "ray_options"]


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "scale-out on Ray",
        "each cell's load dealt over shard actors, one per client node (pip install "
        "'speedmatrix[ray]'); records pooled for exact percentiles (docs/SCALE.md)",
    )
    g.add_argument(
        "--ray",
        metavar="ADDRESS|auto",
        help="the Ray cluster: its head's HOST:PORT, or auto (the cluster of this node)",
    )
    g.add_argument(
        "--shards",
        metavar="K",
        help="client shards per cell (default: one per live node of the cluster); not for "
        "traffic cells or a --max-concurrency open loop",
    )


def ray_options(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """(address, shards) from the flags; UsageError (one line) on a bad value."""
    address = (getattr(args, "ray", None) or "").strip() or None
    text = getattr(args, "shards", None)
    shards = positive_int(text, "--shards") if text else None
    if shards is not None and address is None:
        raise UsageError("--shards needs --ray ADDRESS|auto")
    return address, shards
