"""What the server cannot tell is said in the run's metadata, not guessed
(runmeta.capabilities): metrics, a server-side queue view, forced output length, and
where the KV capacity came from."""

from __future__ import annotations

import pytest
from speedmatrix.adapters.target import Target
from speedmatrix.adapters.types import Capacity, MetricsSpec, OutputControl
from speedmatrix.runmeta import capabilities


def _target(metrics: MetricsSpec, forced: bool, kv: Capacity | None) -> Target:
    t = Target("http://h:1", engine="x", model="m")
    t.metrics = metrics
    t.output = OutputControl(forced=forced, ignore_eos=forced)
    if kv is not None:
        t.capacity["kv_tokens"] = kv
    return t


FULL = MetricsSpec(running="r", waiting="w", kv_usage="k", available=True)
NO_WAITING = MetricsSpec(running="r", kv_usage="k", available=True)
NONE = MetricsSpec(path=None)


@pytest.mark.parametrize(
    "metrics, forced, kv, caps, says",
    [
        (FULL, True, Capacity(100_000, "probed"),
         {"server_metrics": True, "server_queue_view": True, "output_forced": True,
          "kv_capacity": "probed"}, []),
        (NO_WAITING, True, Capacity(100_000, "given"),
         {"server_metrics": True, "server_queue_view": False, "output_forced": True,
          "kv_capacity": "given"}, ["no waiting count"]),
        (NONE, False, None,
         {"server_metrics": False, "server_queue_view": False, "output_forced": False,
          "kv_capacity": "missing"}, ["no metrics", "cannot be made to produce exactly"]),
        # an endpoint named but never answering is no metrics at all
        (MetricsSpec(running="r", waiting="w", available=False), True, Capacity(None), 
         {"server_metrics": False, "server_queue_view": False, "output_forced": True,
          "kv_capacity": "missing"}, ["no metrics"]),
    ],
)  # fmt: skip
def test_capabilities_say_what_the_server_cannot_tell(metrics, forced, kv, caps, says):
    got, notes = capabilities(_target(metrics, forced, kv))
    assert got == caps
    assert len(notes) == len(says)
    for note, text in zip(notes, says):
        assert text in note
