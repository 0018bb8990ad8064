"""The adapter interface, the Target it produces, and the adapter registry.

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
"""

from __future__ import annotations

import copy
import dataclasses
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from speedmatrix.http import ConnectError, HttpClient, HttpError

__all__ = [
    "CAPACITY_NAMES",
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
    "get_adapter",
    "parse_prometheus",
    "precision_label",
    "register_adapter",
    "registered_adapters",
    "split_version",
    "unregister_adapter",
]

CAPACITY_NAMES = ("kv_tokens", "context_length", "max_running")

#: ``stream_options`` values: usage in the final chunk / in every chunk
USAGE_FINAL: Mapping[str, Any] = MappingProxyType({"include_usage": True})
USAGE_CONTINUOUS: Mapping[str, Any] = MappingProxyType(
    {"include_usage": True, "continuous_usage_stats": True}
)
CAPACITY_SOURCES = ("probed", "given", "default", "missing")

#: Keys a probe may return. Capacity values are ints (or None = not known).
PROBE_KEYS = frozenset(
    {
        "version",
        "commit",
        "build",
        "backend",
        "quantization",
        "repository",
        "kv_tokens",
        "context_length",
        "max_running",
        "capacity_detail",  # {name: "where the value came from"}
        "metrics",  # MetricsSpec replacing the adapter's
        "tokenize",  # list[TokenizeSpec] candidates replacing the adapter's
        "token_id_prompts",
        "cache_reset",
        "served_models",  # names the engine says it serves, when /v1/models did not say
        "info",  # dict of further engine facts (page_size, dp_size, ...)
        "warnings",  # list[str]
    }
)


# ---- value types --------------------------------------------------------------------------
@dataclass
class Capacity:
    """One capacity figure and where it came from: ``probed`` from the server, ``given`` by
    the user (flag or argument), ``default`` (a built-in assumption) or ``missing``."""

    value: int | None
    source: str = "missing"
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "source": self.source}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class MetricsSpec:
    """Where the server's Prometheus text is and what its gauges are called.

    ``running``/``waiting`` are summed over all label sets (DP/TP ranks, engines, models);
    ``kv_usage`` (a 0..1 fraction) takes the maximum over label sets. ``url`` is a path
    relative to the target's base URL or a full URL; None = no metrics.
    """

    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None
    path: str | None = "/metrics"
    #: set by discovery: whether the endpoint answered with Prometheus text
    available: bool = False

    def names(self) -> list[str]:
        return [n for n in (self.running, self.waiting, self.kv_usage) if n]

    def reduce(self, samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float | None]:
        """``{"running", "waiting", "kv_usage"}`` from parsed samples (None = not exposed)."""
        out: dict[str, float | None] = {}
        for role, how in (("running", sum), ("waiting", sum), ("kv_usage", max)):
            name = getattr(self, role)
            values = [v for n, _labels, v in samples if name and n == name]
            out[role] = how(values) if values else None
        return out


@dataclass(frozen=True)
class TokenizeSpec:
    """How to ask the server how many tokens a text (or a chat) is.

    ``style``:
      - ``openai``   (vLLM, SGLang, the sim): ``{model, prompt}`` or ``{model, messages}`` →
        ``{tokens, count}``
      - ``llamacpp``: ``{content, add_special: true}`` → ``{tokens}``
      - ``tgi``:      ``{inputs}`` → ``[{id, text, start, stop}]``
      - ``lmdeploy``: ``{input}`` → ``{input_ids, length}``
    """

    path: str
    style: str = "openai"
    messages: bool = False

    def request(
        self, model: str | None, text: str | None = None, messages: list | None = None
    ) -> dict[str, Any]:
        if messages is not None:
            if not self.messages:
                raise ValueError(f"{self.path} ({self.style}) cannot tokenize chat messages")
            body: dict[str, Any] = {"messages": messages, "add_generation_prompt": True}
            if model:
                body["model"] = model
            return body
        if self.style == "openai":
            body = {"prompt": text}
            if model:
                body["model"] = model
            return body
        if self.style == "llamacpp":
            # add_special: count the BOS the completion endpoint adds too
            return {"content": text, "add_special": True}
        if self.style == "tgi":
            return {"inputs": text}
        if self.style == "lmdeploy":
            return {"input": text}
        raise ValueError(f"unknown tokenize style {self.style!r}")

    def parse(self, answer: Any) -> tuple[int, list[int] | None]:
        """(token count, token ids or None) from the endpoint's JSON answer."""
        if self.style == "tgi" and isinstance(answer, list):
            return len(answer), [int(t["id"]) for t in answer if isinstance(t, dict) and "id" in t]
        if isinstance(answer, dict):
            ids = answer.get("tokens", answer.get("input_ids"))
            if isinstance(ids, list) and ids and isinstance(ids[0], dict):
                ids = [t.get("id") for t in ids]
            ids = [int(t) for t in ids] if isinstance(ids, list) else None
            count = answer.get("count", answer.get("length"))
            if isinstance(count, int):
                return count, ids
            if ids is not None:
                return len(ids), ids
        raise ValueError(f"tokenize answer has no token count: {str(answer)[:120]}")


@dataclass
class OutputControl:
    """How to make the server produce exactly ``max_tokens`` output tokens.

    ``forced`` is False where the engine offers no way (TGI, Ollama): outputs may end early at
    an end-of-sequence token and the runner must say the output length was not forced.
    """

    forced: bool = False
    ignore_eos: bool = False
    min_tokens_field: str | None = None
    #: extra names the max output goes under for chat requests (besides ``max_tokens``)
    chat_max_fields: tuple[str, ...] = ()
    note: str = ""

    def fields(self, api: str, max_tokens: int) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": int(max_tokens)}
        if api == "chat":
            for name in self.chat_max_fields:
                out[name] = int(max_tokens)
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.min_tokens_field:
            out[self.min_tokens_field] = int(max_tokens)
        return out


# ---- the target ---------------------------------------------------------------------------
@dataclass
class Target:
    """Everything speedmatrix knows about the server after discovery.

    The API key is held outside the dataclass fields: it is not in repr(), in ``==`` or in
    :meth:`to_dict`; read it with :attr:`api_key`.
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
        object.__setattr__(self, "_api_key", None)

    # -- secrets --
    @property
    def api_key(self) -> str | None:
        return getattr(self, "_api_key", None)

    def with_api_key(self, key: str | None) -> Target:
        object.__setattr__(self, "_api_key", key or None)
        return self

    def client(self, timeout_s: float = 10.0) -> HttpClient:
        return HttpClient(self.url, self.api_key, timeout_s)

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


_DTYPE_LABELS = {
    "bfloat16": "BF16",
    "bf16": "BF16",
    "float16": "FP16",
    "half": "FP16",
    "fp16": "FP16",
    "float32": "FP32",
    "float": "FP32",
    "fp32": "FP32",
}


def precision_label(dtype: Any) -> str | None:
    """The report's precision text for a weights dtype (``bfloat16`` → ``BF16``); None for
    ``auto`` or nothing (the engine picked the checkpoint's dtype and did not say which)."""
    if not isinstance(dtype, str) or not dtype.strip():
        return None
    d = dtype.strip().lower().removeprefix("torch.")
    if d == "auto":
        return None
    return _DTYPE_LABELS.get(d, dtype.strip().upper())


def display_model_name(model_path: str | None) -> str | None:
    """A model's display name from its path: the last path component
    (``meta-models/Muse-Glimmer-30B`` → ``Muse-Glimmer-30B``, an HF id ``org/Name`` →
    ``Name``); in a Hugging Face cache (``.../models--org--Name/snapshots/<hash>``) the
    name of the model folder, not the hash. None for an empty path."""
    if not model_path:
        return None
    parts = [p for p in re.split(r"[/\\]+", str(model_path).strip()) if p]
    if not parts:
        return None
    for i, part in enumerate(parts):
        if part.startswith("models--") and "--" in part[8:]:
            return part.rsplit("--", 1)[1]
        if part == "snapshots" and i > 0 and i == len(parts) - 2:
            return parts[i - 1]
    return parts[-1]


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
    client = HttpClient(target.url, api_key or target.api_key, timeout_s)
    try:
        load = target.read_load(client)
    except (HttpError, ConnectError, ValueError):
        return None
    if load is None:
        return None
    return load["running"], load["waiting"]


# ---- probing ------------------------------------------------------------------------------
class ProbeContext:
    """What adapters probe with: the client, the /v1/models answer, and cached GETs that
    turn a missing endpoint into None (so probing is cheap to write and never repeats)."""

    def __init__(self, client: HttpClient, models_answer: Any = None) -> None:
        self.client = client
        self.models_answer = models_answer
        self.models: list[dict[str, Any]] = []
        if isinstance(models_answer, dict) and isinstance(models_answer.get("data"), list):
            self.models = [m for m in models_answer["data"] if isinstance(m, dict)]
        elif isinstance(models_answer, dict) and isinstance(models_answer.get("models"), list):
            self.models = [m for m in models_answer["models"] if isinstance(m, dict)]
        self.model_ids = [str(m.get("id") or m.get("name")) for m in self.models]
        self.owned_by = {str(m.get("owned_by", "")).lower() for m in self.models} - {""}
        self.answered: list[str] = []
        self.failures: dict[str, str] = {}
        self._cache: dict[tuple[str, str], Any] = {}

    def owned_by_matches(self, adapter: Adapter) -> bool:
        return bool(self.owned_by & {o.lower() for o in adapter.owned_by})

    def max_model_len(self, model: str | None = None) -> int | None:
        """``max_model_len`` (or a similar key) of the served model in /v1/models."""
        for entry in self.models:
            if model and str(entry.get("id")) != model:
                continue
            for key in ("max_model_len", "context_length", "max_context_length", "context_window"):
                value = entry.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    def model_root(self, model: str | None) -> str | None:
        """``root`` of the served model in /v1/models (vLLM: the model path or HF id it
        loaded); None when absent."""
        for entry in self.models:
            if model and str(entry.get("id")) != model:
                continue
            root = entry.get("root")
            if isinstance(root, str) and root.strip():
                return root.strip()
        return None

    def _get(self, kind: str, path: str) -> Any:
        key = (kind, path)
        if key in self._cache:
            return self._cache[key]
        value: Any = None
        try:
            if kind == "json":
                value = self.client.get_json(path)
            else:
                value = self.client.get_text(path)
            self.answered.append(path)
        except HttpError as exc:
            self.failures[path] = f"HTTP {exc.status}"
        except ConnectError as exc:
            # the server answered /v1/models, so this is an endpoint that hangs or drops
            self.failures[path] = exc.reason
        self._cache[key] = value
        return value

    def get_json(self, path: str) -> Any:
        """GET path as JSON; None if it fails in any way."""
        return self._get("json", path)

    def get_dict(self, path: str) -> dict[str, Any] | None:
        value = self.get_json(path)
        return value if isinstance(value, dict) else None

    def get_text(self, path: str) -> str | None:
        """GET path as text; None if it fails in any way."""
        return self._get("text", path)

    def get_metrics(self, path: str = "/metrics") -> list[tuple[str, dict[str, str], float]] | None:
        """Parsed Prometheus samples at path; None when it is missing or not Prometheus."""
        text = self.get_text(path)
        if text is None:
            return None
        try:
            samples = parse_prometheus(text)
        except ValueError:
            return None
        return samples if samples or text.strip() == "" else None


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


def get_adapter(name: str) -> type[Adapter]:
    for a in _REGISTRY:
        if a.name == name:
            return a
    from speedmatrix.adapters.generic import GenericAdapter

    if name == GenericAdapter.name:
        return GenericAdapter
    raise ValueError(f"unknown engine {name!r}; adapters: {', '.join(adapter_names())}, generic")


# ---- small parsers shared by adapters -----------------------------------------------------
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of Prometheus text exposition: ``[(name, labels, value), ...]``.

    For discovery and the idle check only (the sampler during a cell is C++). Raises
    ValueError on a line that is not a sample, a comment or blank.
    """
    out: list[tuple[str, dict[str, str], float]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError(f"line {number} is not Prometheus text: {line[:80]!r}")
        labels: dict[str, str] = {}
        if match.group("labels"):
            body = match.group("labels")
            pos = 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                if not lm:
                    raise ValueError(f"line {number}: bad labels {body[:80]!r}")
                labels[lm.group(1)] = (
                    lm.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                )
                pos = lm.end()
        try:
            value = float(match.group("value"))
        except ValueError:
            raise ValueError(f"line {number}: bad value {match.group('value')!r}") from None
        out.append((match.group("name"), labels, value))
    return out


_GIT_SUFFIX = re.compile(r"\+g([0-9a-f]{7,40})")


def split_version(text: str | None) -> tuple[str | None, str | None]:
    """(version, commit) from e.g. ``0.5.6.post3.dev9265+g05c584c44`` (commit 05c584c44);
    the version is kept whole."""
    if not text:
        return None, None
    match = _GIT_SUFFIX.search(text)
    return text, (match.group(1) if match else None)


def positive_int(value: Any) -> int | None:
    """``value`` as a positive int, else None (for probed fields that may be null/"None")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
        return number if number > 0 else None
    return None


def first_metric(
    samples: list[tuple[str, dict[str, str], float]] | None, *names: str
) -> str | None:
    """The first of ``names`` that occurs in samples."""
    if not samples:
        return None
    present = {n for n, _l, _v in samples}
    for name in names:
        if name in present:
            return name
    return None
