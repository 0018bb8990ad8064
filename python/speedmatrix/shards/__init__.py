"""Scale-out on Ray (issue 22, docs/SCALE.md "Many machines"): one cell's load dealt over
K client processes, one shard actor per client node, each wrapping the C++ core with its
own event loops. Only control messages and end-of-cell raw records cross Ray, never a
token. The modules:

* `clock`: a shard's clock offset from ping round trips (pure);
* `deal`: a CellSpec dealt over shards, and carried as plain fields (pure);
* `merge`: the shards' records pooled into one cell's, and what makes it an error (pure);
* `actor`: the shard actor (the core, a common start time, its records back);
* `metrics`: the server's /metrics sampled once, by the driver;
* `pool`: the bounded connection, the placement group and the actors (imports Ray);
* `driver`: one cell on the shards.

Ray is optional (``pip install speedmatrix[ray]``): only `pool` imports it, when asked.
"""

from speedmatrix.shards.clock import ClockOffset, Ping, offset_of
from speedmatrix.shards.deal import Dealt, deal, deal_closed, shards_for, unsharded_why
from speedmatrix.shards.merge import ShardPart, pool_records

__all__ = [
    "ClockOffset",
    "Dealt",
    "Ping",
    "ShardPart",
    "deal",
    "deal_closed",
    "offset_of",
    "pool_records",
    "shards_for",
    "unsharded_why",
]
