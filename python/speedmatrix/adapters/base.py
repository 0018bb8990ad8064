"""What an adapter is written with: the names of the adapter interface in one place.

An adapter knows one engine: how to recognise it, which endpoints give its version and
capacity, what its metrics are called, how its tokenize endpoint is spoken to, and how to make
it produce exactly ``max_tokens`` tokens. ``discover()`` (discovery.py) runs the adapters'
``probe`` in order and turns the first answer into a :class:`Target`.

Writing one::

    from speedmatrix.adapters import Adapter, MetricsSpec, register_adapter

    @register_adapter
    class MyEngine(Adapter):
        name = "myengine"
        owned_by = ("myengine",)
        metrics = MetricsSpec(running="my_running", waiting="my_waiting")

        def probe(self, ctx):
            info = ctx.get_json("/my/info")
            if info is None and not ctx.owned_by_matches(self):
                return None            # not this engine
            return {"version": info.get("version"), "kv_tokens": info.get("kv_pool")}

``probe`` returns None (not this engine) or a dict whose keys are among :data:`PROBE_KEYS`.

The code lives by concern: value types (types.py), the Target (target.py), the probe
context and the Prometheus reader (probe.py), the interface and the registry
(registry.py), small parsers (helpers.py). This module only gathers their names.
"""

from __future__ import annotations

from speedmatrix.adapters.helpers import first_metric, positive_int, split_version
from speedmatrix.adapters.probe import ProbeContext, parse_prometheus
from speedmatrix.adapters.registry import (
    Adapter,
    adapter_names,
    find_adapter,
    register_adapter,
    registered_adapters,
    unregister_adapter,
)
from speedmatrix.adapters.target import Target, read_load, strip_credentials
from speedmatrix.adapters.types import (
    CAPACITY_NAMES,
    CAPACITY_SOURCES,
    PROBE_KEYS,
    USAGE_CONTINUOUS,
    USAGE_FINAL,
    Capacity,
    MetricsSpec,
    OutputControl,
    TokenizeSpec,
)
from speedmatrix.naming import display_model_name, precision_label

__all__ = [
    "CAPACITY_NAMES",
    "CAPACITY_SOURCES",
    "PROBE_KEYS",
    "USAGE_CONTINUOUS",
    "USAGE_FINAL",
    "Adapter",
    "Capacity",
    "MetricsSpec",
    "OutputControl",
    "ProbeContext",
    "Target",
    "TokenizeSpec",
    "adapter_names",
    "display_model_name",
    "find_adapter",
    "first_metric",
    "parse_prometheus",
    "positive_int",
    "precision_label",
    "read_load",
    "register_adapter",
    "registered_adapters",
    "split_version",
    "strip_credentials",
    "unregister_adapter",
]
