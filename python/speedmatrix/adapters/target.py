"""The Target: one discovered server (engine facts, capacity, metrics, tokenize endpoint,
how to force the output length), and the load check before a cell."""

from __future__ import annotations

import copy
import dataclasses
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from speedmatrix.adapters.probe import parse_prometheus
from speedmatrix.adapters.types import (
    CAPACITY_NAMES,
    CAPACITY_SOURCES,
    Capacity,
    MetricsSpec,
    OutputControl,
    TokenizeSpec,
)
from speedmatrix.http import ClientConfig, ConnectError, HttpClient, HttpError
from speedmatrix.naming import display_model_name


# ---- the target ---------------------------------------------------------------------------
@dataclass
class Target:
    """Everything speedmatrix knows about the server after discovery.

    How to reach it (API key, Basic auth, TLS: a :class:`ClientConfig`) is held outside the
    dataclass fields: it is not in repr(), in ``==`` or in :meth:`to_dict`; read it with
    :attr:`client_config` (the key alone with :attr:`api_key`).
    """

    url: str
    engine: str = "generic"
    version: str | None = None
    commit: str | None = None
    build: str | None = None
    backend: str | None = None
    quantization: str | None = None
    repository: str | None = None
    model: str | None = None
    models: list[str] = field(default_factory=list)
    capacity: dict[str, Capacity] = field(
        default_factory=lambda: {n: Capacity(None) for n in CAPACITY_NAMES}
    )
    metrics: MetricsSpec = field(default_factory=lambda: MetricsSpec(path=None))
    tokenize: TokenizeSpec | None = None
    output: OutputControl = field(default_factory=OutputControl)
    token_id_prompts: bool = False
    #: stream_options sent with streaming requests; None = send none
    stream_options: dict[str, Any] | None = field(default_factory=lambda: {"include_usage": True})
    #: POST path that empties the prefix cache, None = none known
    cache_reset: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: endpoints that answered during discovery, in order
    probed: list[str] = field(default_factory=list)
    #: the model's display name given by the user (``--model-name``); None = derive it
    model_name: str | None = None
    #: engine name given by the user when it names no adapter (``--engine mlc-llm``)
    engine_name: str | None = None
    #: where each engine fact came from: {"version": "probed" | "given" | "default", ...}
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.url = strip_credentials(self.url).rstrip("/")
        for name in CAPACITY_NAMES:
            self.capacity.setdefault(name, Capacity(None))
        object.__setattr__(self, "_client_config", ClientConfig())

    # -- secrets --
    @property
    def client_config(self) -> ClientConfig:
        return getattr(self, "_client_config", None) or ClientConfig()

    @property
    def api_key(self) -> str | None:
        return self.client_config.api_key

    def with_client(self, config: ClientConfig) -> Target:
        object.__setattr__(self, "_client_config", config)
        return self

    def with_api_key(self, key: str | None) -> Target:
        return self.with_client(self.client_config.replace(api_key=key or None))

    def client(self, timeout_s: float = 10.0) -> HttpClient:
        return self.client_config.client(self.url, timeout_s)

    # -- capacity shortcuts --
    @property
    def kv_tokens(self) -> int | None:
        return self.capacity["kv_tokens"].value

    @property
    def context_length(self) -> int | None:
        return self.capacity["context_length"].value

    @property
    def max_running(self) -> int | None:
        return self.capacity["max_running"].value

    def set_capacity(self, name: str, value: int | None, source: str, detail: str = "") -> None:
        if name not in CAPACITY_NAMES:
            raise ValueError(f"unknown capacity {name!r} (known: {', '.join(CAPACITY_NAMES)})")
        if source not in CAPACITY_SOURCES:
            raise ValueError(f"unknown capacity source {source!r}")
        if value is None:
            source = "missing"
        self.capacity[name] = Capacity(None if value is None else int(value), source, detail)

    # -- URLs --
    @property
    def base_url(self) -> str:
        """Alias of :attr:`url` (the server's base URL, without ``/v1``)."""
        return self.url

    def endpoint(self, api: str) -> str:
        """Full URL of the generation endpoint for ``api`` ("completions" | "chat")."""
        if api == "completions":
            return self.url + "/v1/completions"
        if api == "chat":
            return self.url + "/v1/chat/completions"
        raise ValueError(f"api: {api!r} is not one of completions, chat")

    @property
    def metrics_url(self) -> str | None:
        if not self.metrics.available or not self.metrics.path:
            return None
        if self.metrics.path.startswith(("http://", "https://")):
            return self.metrics.path
        return self.url + "/" + self.metrics.path.lstrip("/")

    def read_load(self, client: HttpClient | None = None) -> dict[str, float | None] | None:
        """The server's running/waiting requests and KV use now (cold path: the idle check
        before a cell); None when the server has no metrics."""
        url = self.metrics_url
        if url is None:
            return None
        text = (client or self.client()).get_text(url)
        return self.metrics.reduce(parse_prometheus(text))

    # -- serialisation --
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (no API key)."""
        out = dataclasses.asdict(self)
        out["capacity"] = {k: v.to_dict() for k, v in self.capacity.items()}
        out["metrics_url"] = self.metrics_url
        return copy.deepcopy(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any], api_key: str | None = None) -> Target:
        """The Target :meth:`to_dict` described (e.g. from a saved run, to resume it)."""
        data = dict(data)
        data.pop("metrics_url", None)
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if isinstance(data.get("capacity"), dict):
            data["capacity"] = {
                k: Capacity(v.get("value"), v.get("source", "missing"), v.get("detail", ""))
                for k, v in data["capacity"].items()
                if isinstance(v, dict)
            }
        if isinstance(data.get("metrics"), dict):
            data["metrics"] = MetricsSpec(**data["metrics"])
        if isinstance(data.get("tokenize"), dict):
            data["tokenize"] = TokenizeSpec(**data["tokenize"])
        if isinstance(data.get("output"), dict):
            out = dict(data["output"])
            out["chat_max_fields"] = tuple(out.get("chat_max_fields") or ())
            data["output"] = OutputControl(**out)
        return cls(**data).with_api_key(api_key)

    @property
    def simulated(self) -> bool:
        """True when the server is speedmatrix's built-in engine (seen at /sim/state)."""
        return bool(self.info.get("simulated"))

    @property
    def model_path(self) -> str | None:
        """The weights the server loaded, as it says (SGLang ``model_path``, vLLM ``root``)."""
        path = self.info.get("model_path")
        return str(path) if path else None

    def display_model(self) -> tuple[str | None, str]:
        """(model name for the report's title, where it came from): given by the user, the
        last component of the probed model path, else the served name."""
        if self.model_name:
            return self.model_name, "given"
        derived = display_model_name(self.model_path)
        if derived:
            return derived, "model_path"
        return self.model, "served_model"

    def engine_meta(self) -> dict[str, Any]:
        """``meta.engine`` of run.json: the engine facts, the probed extras (``info``) and the
        source of each fact. A simulated engine says so (``simulated``, backend
        ``simulated``) and gets no adapter-default repository: it is not that project's code."""
        sources = dict(self.sources)
        repository = self.repository
        backend = self.backend
        if self.simulated:
            if sources.get("repository") == "default":
                repository = None
                sources.pop("repository")
            if not backend:
                backend = "simulated"
                sources["backend"] = "probed"
        info = {k: v for k, v in self.info.items() if not isinstance(v, (dict, list))}
        return {
            "name": self.engine_name or self.engine,
            "adapter": self.engine,
            "version": self.version,
            "commit": self.commit,
            "quantization": self.quantization,
            "dtype": self.info.get("dtype"),
            "backend": backend,
            "build": self.build,
            "repository": repository,
            "model_path": self.model_path,
            "tp_size": self.info.get("tp_size"),
            "simulated": self.simulated,
            "info": info,
            "sources": {k: v for k, v in sources.items() if v},
        }

    def capacity_meta(self) -> dict[str, dict[str, Any]]:
        """``meta.capacity`` of run.json: ``{name: {"value", "source"}}``."""
        return {k: v.to_dict() for k, v in self.capacity.items()}

    def target_meta(self, api: str) -> dict[str, Any]:
        """``meta.target`` of run.json (URL without credentials); ``model_name`` is the
        report's display name, ``model_name_source`` says whence (given, model_path,
        served_model)."""
        name, source = self.display_model()
        return {
            "url": self.url,
            "model": self.model,
            "api": api,
            "engine": self.engine,
            "model_path": self.model_path,
            "model_name": name,
            "model_name_source": source if name else None,
        }


def strip_credentials(url: str) -> str:
    """``http://user:pw@host/x`` → ``http://host/x``."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def read_load(
    target: Target, api_key: str | None = None, timeout_s: float = 5.0
) -> tuple[float | None, float | None] | None:
    """(running, waiting) requests the server reports now, for the idle check before a cell.
    None when the target has no metrics or they cannot be read right now."""
    if target.metrics_url is None:
        return None
    config = target.client_config
    if api_key and api_key != config.api_key:
        config = config.replace(api_key=api_key)
    client = config.client(target.url, timeout_s)
    try:
        load = target.read_load(client)
    except (HttpError, ConnectError, ValueError):
        return None
    if load is None:
        return None
    return load["running"], load["waiting"]
