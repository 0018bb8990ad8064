"""The adapter interface (`Adapter`) and the registry of adapters in probing order.
The generic fallback is not registered: `speedmatrix.adapters.discovery.get_adapter`
knows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from speedmatrix.adapters.probe import ProbeContext
from speedmatrix.adapters.types import USAGE_FINAL, MetricsSpec, OutputControl, TokenizeSpec


# ---- the interface ------------------------------------------------------------------------
class Adapter:
    """One engine. Subclasses set the class attributes and implement :meth:`probe`."""

    name: ClassVar[str] = "generic"
    #: ``owned_by`` values in /v1/models that name this engine
    owned_by: ClassVar[tuple[str, ...]] = ()
    repository: ClassVar[str | None] = None
    metrics: ClassVar[MetricsSpec] = MetricsSpec(path=None)
    #: tokenize endpoints to try, in order; discovery keeps the first that answers
    tokenize: ClassVar[tuple[TokenizeSpec, ...]] = ()
    output: ClassVar[OutputControl] = OutputControl()
    token_id_prompts: ClassVar[bool] = False
    stream_options: ClassVar[Mapping[str, Any] | None] = USAGE_FINAL
    cache_reset: ClassVar[str | None] = None
    #: a request field (set true) that makes the engine stream each chunk's token ids in
    #: the choice's ``token_ids`` (vLLM ``return_token_ids``): sessions append them
    answer_ids_field: ClassVar[str | None] = None

    def probe(self, ctx: ProbeContext) -> dict[str, Any] | None:
        """Return None if the server is not this engine, else what was found (PROBE_KEYS)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<adapter {self.name}>"


# ---- registry -----------------------------------------------------------------------------
_REGISTRY: list[type[Adapter]] = []


def register_adapter(cls: type[Adapter] | None = None, *, first: bool = True):
    """Register an adapter class (usable as a decorator). User adapters go before the built-in
    ones by default so they can take over an engine; one with the same ``name`` replaces it."""

    def add(adapter_cls: type[Adapter]) -> type[Adapter]:
        if not (isinstance(adapter_cls, type) and issubclass(adapter_cls, Adapter)):
            raise TypeError(f"{adapter_cls!r} is not an Adapter subclass")
        if not adapter_cls.name or not isinstance(adapter_cls.name, str):
            raise ValueError(f"{adapter_cls.__name__}.name must be a non-empty string")
        for i, existing in enumerate(_REGISTRY):
            if existing.name == adapter_cls.name:
                del _REGISTRY[i]
                break
        if first:
            _REGISTRY.insert(0, adapter_cls)
        else:
            _REGISTRY.append(adapter_cls)
        return adapter_cls

    return add(cls) if cls is not None else add


def unregister_adapter(name: str) -> None:
    for i, existing in enumerate(_REGISTRY):
        if existing.name == name:
            del _REGISTRY[i]
            return
    raise KeyError(name)


def registered_adapters() -> list[type[Adapter]]:
    """Adapter classes in probing order (the generic fallback is not among them)."""
    return list(_REGISTRY)


def adapter_names() -> list[str]:
    return [a.name for a in _REGISTRY]


def find_adapter(name: str) -> type[Adapter] | None:
    """The registered adapter called ``name``, or None."""
    for a in _REGISTRY:
        if a.name == name:
            return a
    return None
