"""``discover()``: probe a server once and describe it as a :class:`Target`.

Order: ``GET /v1/models`` (reachability, auth, served models, ``owned_by``); then the
adapters, those whose ``owned_by`` matches first, the rest in registry order (user adapters,
then vLLM, SGLang, TensorRT-LLM, LMDeploy, llama.cpp, TGI, Ollama), the generic
OpenAI adapter last. The first adapter whose ``probe`` does not return None describes the
server. Then the tokenize endpoint is checked with a two-word request, the metrics endpoint
for the gauge names, and user overrides are applied (recorded as ``given``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from speedmatrix.adapters.base import (
    CAPACITY_NAMES,
    PROBE_KEYS,
    Adapter,
    MetricsSpec,
    ProbeContext,
    Target,
    TokenizeSpec,
    adapter_names,
    find_adapter,
    positive_int,
    registered_adapters,
    strip_credentials,
)
from speedmatrix.adapters.generic import GenericAdapter
from speedmatrix.errors import TargetError, clip, some_of
from speedmatrix.http import ClientConfig, HttpClient, HttpError, url_credentials

__all__ = ["OVERRIDE_KEYS", "ModelNotServedError", "discover", "normalise_url"]

#: engine facts a user may give (``engine_version`` sets ``version``); recorded as ``given``
ENGINE_FACTS = ("engine_version", "commit", "build", "backend", "quantization", "repository")

#: keys of ``overrides``: capacities, the engine (adapter name, or any name for the report),
#: engine facts, the model's display name
OVERRIDE_KEYS = frozenset(
    set(CAPACITY_NAMES)
    | {"engine", "model_name", *ENGINE_FACTS}
    | {"token_id_prompts", "metrics_path"}
)


class ModelNotServedError(TargetError):
    def __init__(self, model: str, offered: list[str]) -> None:
        offer = some_of(offered) if offered else "nothing"
        super().__init__(f"model {clip(model, 120)!r} is not served; the server offers: {offer}")
        self.model = model
        self.offered = offered


class NotOpenAIError(TargetError):
    """Something answers at the URL, but not the OpenAI API: /v1/models is not there and
    no engine's own endpoint answered (a plain web server, a wrong port)."""


def get_adapter(name: str) -> type[Adapter]:
    """The adapter called ``name``: a registered one, or the generic fallback."""
    found = find_adapter(name)
    if found is not None:
        return found
    if name == GenericAdapter.name:
        return GenericAdapter
    raise ValueError(f"unknown engine {name!r}; adapters: {', '.join(adapter_names())}, generic")


def normalise_url(url: str) -> str:
    """Base URL of the server: credentials kept for the client, trailing ``/`` and a
    trailing ``/v1`` (people paste the OpenAI base URL) removed."""
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    url = url.removesuffix("/v1")
    return url


def discover(
    url: str,
    api_key: str | None = None,
    model: str | None = None,
    overrides: dict[str, Any] | None = None,
    adapters: list[type[Adapter] | Adapter] | None = None,
    timeout_s: float | None = None,
    client: ClientConfig | None = None,
) -> Target:
    """Probe the server at ``url`` and return its Target.

    ``client``: how to reach it (key, Basic auth, TLS, timeout), kept on the Target for the
    prompt builder and the core; by default the URL's own credentials, ``api_key`` and the
    environment's CA file (:meth:`ClientConfig.make`).

    ``overrides`` (CLI flags / API arguments) win over probed values: ``kv_tokens``,
    ``context_length``, ``max_running`` (recorded with source ``given``), ``engine`` (an
    adapter's name skips detection and uses that adapter; any other name is detected as usual
    and only names the engine in the report), ``engine_version``, ``commit``, ``build``,
    ``backend``, ``quantization``, ``repository`` (each recorded in ``Target.sources`` as
    ``given``), ``model_name`` (the report's display name), ``token_id_prompts``,
    ``metrics_path``.
    ``adapters`` replaces the registry for this call (the generic fallback is still tried last).

    Raises ConnectError (unreachable), AuthError (401/403), ModelNotServedError, HttpError.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - OVERRIDE_KEYS)
    if unknown:
        raise ValueError(
            f"overrides: unknown key {unknown[0]!r} (known: {', '.join(sorted(OVERRIDE_KEYS))})"
        )
    base = normalise_url(url)
    config = client or ClientConfig.make(base, api_key)
    if api_key and api_key != config.api_key:
        config = config.replace(api_key=api_key)
    if config.basic_auth is None and url_credentials(base):  # a config made without the URL
        config = config.replace(basic_auth=url_credentials(base))
    if timeout_s is not None:
        config = config.replace(timeout_s=float(timeout_s))
    http = config.client(base)
    warnings: list[str] = []

    try:
        models_answer = http.get_json("/v1/models")
    except HttpError as exc:
        if exc.status in (401, 403) or exc.status >= 500 or exc.status == 200:
            raise
        models_answer = None
        warnings.append(f"/v1/models answered HTTP {exc.status}: served models unknown")
    ctx = ProbeContext(http, models_answer)
    if models_answer is not None:
        ctx.answered.insert(0, "/v1/models")

    given = _adapter_override(overrides.get("engine"))
    adapter, found = _detect(ctx, given, adapters, warnings)
    if models_answer is None and adapter.name == GenericAdapter.name and given is None:
        # Generation requests to it would each fail, and a failed cell and a report would
        # say "the server" failed: stop here, before anything is sent or written.
        # (a 200 whose JSON is null gives no warning of its own)
        why = warnings[0] if warnings else "/v1/models answered no model list"
        raise NotOpenAIError(
            f"{base} does not speak the OpenAI API: {why}, and no engine endpoint "
            "answered (a wrong port? --engine generic measures it anyway)"
        )
    target = _build_target(base, adapter, found, ctx, warnings)
    target.with_client(config)
    _choose_model(target, ctx, found, model)
    if "metrics_path" in overrides:
        target.metrics.path = overrides["metrics_path"] or None
    _check_metrics(target, ctx)
    _check_sim(target, ctx)
    _check_tokenize(target, http, found)
    _apply_overrides(target, overrides)
    target.probed = list(dict.fromkeys([*ctx.answered, *target.probed]))
    return target


# ---- steps --------------------------------------------------------------------------------
def _adapter_override(engine: Any) -> str | None:
    """The ``engine`` override when it names an adapter; None for any other name (that one
    only names the engine in the report, see :func:`_apply_overrides`)."""
    if not engine:
        return None
    try:
        get_adapter(str(engine))
    except ValueError:
        return None
    return str(engine)


def _adapter_order(ctx: ProbeContext, adapters: list | None) -> list[Adapter]:
    pool = registered_adapters() if adapters is None else list(adapters)
    instances = [a() if isinstance(a, type) else a for a in pool]
    instances = [a for a in instances if a.name != GenericAdapter.name]
    matching = [a for a in instances if ctx.owned_by_matches(a)]
    rest = [a for a in instances if not ctx.owned_by_matches(a)]
    return [*matching, *rest, GenericAdapter()]


def _detect(
    ctx: ProbeContext, engine: str | None, adapters: list | None, warnings: list[str]
) -> tuple[Adapter, dict[str, Any]]:
    if engine:
        chosen = get_adapter(engine)()
        found = chosen.probe(ctx)
        if found is None:
            warnings.append(f"engine given as {engine!r} but its endpoints did not answer")
            found = {}
        return chosen, found
    for adapter in _adapter_order(ctx, adapters):
        try:
            found = adapter.probe(ctx)
        except Exception as exc:  # noqa: BLE001 - a third-party adapter's bug must not stop discovery
            warnings.append(f"adapter {adapter.name!r} failed while probing: {exc}")
            continue
        if found is not None:
            return adapter, found
    raise AssertionError("the generic adapter always matches")  # pragma: no cover


def _build_target(
    base: str, adapter: Adapter, found: dict[str, Any], ctx: ProbeContext, warnings: list[str]
) -> Target:
    bad = sorted(set(found) - PROBE_KEYS)
    if bad:
        warnings.append(f"adapter {adapter.name!r} returned unknown keys: {', '.join(bad)}")
    metrics = found.get("metrics") or adapter.metrics
    target = Target(
        url=strip_credentials(base),
        engine=adapter.name,
        version=found.get("version"),
        commit=found.get("commit"),
        build=found.get("build"),
        backend=found.get("backend"),
        quantization=found.get("quantization"),
        repository=found.get("repository") or adapter.repository,
        metrics=MetricsSpec(**metrics.__dict__),
        output=dataclasses.replace(adapter.output),  # a copy: the adapter's stays as it is
        token_id_prompts=bool(found.get("token_id_prompts", adapter.token_id_prompts)),
        stream_options=(
            dict(adapter.stream_options) if adapter.stream_options is not None else None
        ),
        cache_reset=found.get("cache_reset", adapter.cache_reset),
        info=dict(found.get("info") or {}),
        warnings=[*warnings, *(found.get("warnings") or [])],
    )
    target.sources = {"name": "probed"}
    for key in ("version", "commit", "build", "backend", "quantization", "repository"):
        if found.get(key):
            target.sources[key] = "probed"
    if not found.get("repository") and adapter.repository:
        target.sources["repository"] = "default"  # the adapter's project, not probed
    details = found.get("capacity_detail") or {}
    for name in CAPACITY_NAMES:
        value = positive_int(found.get(name))
        if value is not None:
            target.set_capacity(name, value, "probed", details.get(name, ""))
    return target


def _choose_model(
    target: Target, ctx: ProbeContext, found: dict[str, Any], model: str | None
) -> None:
    offered = list(ctx.model_ids) or [str(m) for m in found.get("served_models") or []]
    target.models = offered
    if model:
        if offered and model not in offered:
            raise ModelNotServedError(model, offered)
        target.model = model
    elif offered:
        target.model = offered[0]
        if len(offered) > 1:
            target.warnings.append(
                f"the server offers several models ({some_of(offered)}); using "
                f"{clip(offered[0], 120)!r} (choose with --model)"
            )
    else:
        target.warnings.append("the server did not say which model it serves (give --model)")
    if not target.info.get("model_path") and target.model:
        root = ctx.model_root(target.model)  # vLLM: the path or HF id the weights came from
        if root:
            target.info["model_path"] = root
    if target.context_length is None and target.model:
        length = ctx.max_model_len(target.model)
        if length:
            target.set_capacity("context_length", length, "probed", "/v1/models max_model_len")


def _check_metrics(target: Target, ctx: ProbeContext) -> None:
    spec = target.metrics
    if not spec.path or not spec.names():
        spec.available = False
        if target.engine != GenericAdapter.name:
            target.warnings.append(
                f"{target.engine} metrics are not available: queueing is judged from the "
                "client's view and the server's running requests are not sampled"
            )
        return
    samples = ctx.get_metrics(spec.path)
    if samples is None:
        spec.available = False
        hint = {
            "sglang": " (start SGLang with --enable-metrics)",
            "llamacpp": " (start llama-server with --metrics)",
        }.get(target.engine, "")
        target.warnings.append(
            f"no Prometheus metrics at {spec.path}{hint}: queueing is judged from the client's "
            "view and the server's running requests are not sampled"
        )
        return
    spec.available = True
    present = {n for n, _l, _v in samples}
    missing = [n for n in spec.names() if n not in present]
    if missing:
        target.warnings.append(f"metrics at {spec.path} lack {', '.join(missing)}")


def _check_tokenize(target: Target, client: HttpClient, found: dict[str, Any]) -> None:
    candidates: list[TokenizeSpec] = list(found.get("tokenize") or get_tokenize(target))
    for spec in candidates:
        try:
            count, _ids = spec.count(client, target.model, "a b")
        except (HttpError, ValueError, TypeError, KeyError):
            continue
        if count <= 0:
            continue
        messages = spec.messages
        if messages:
            chat = [{"role": "user", "content": "a b"}]
            try:
                spec.count(client, target.model, messages=chat)
            except (HttpError, ValueError, TypeError, KeyError):
                messages = False
        target.tokenize = TokenizeSpec(
            spec.path, spec.style, messages, spec.template if messages else None
        )
        target.probed.append(spec.path)
        return
    target.tokenize = None
    if candidates:
        target.warnings.append(
            "no tokenize endpoint answered: prompt lengths are calibrated against "
            "usage.prompt_tokens"
        )


def get_tokenize(target: Target) -> tuple[TokenizeSpec, ...]:
    try:
        return get_adapter(target.engine).tokenize
    except ValueError:
        return ()


def _check_sim(target: Target, ctx: ProbeContext) -> None:
    """The built-in engine says so at /sim/state; its KV pool is there too."""
    state = ctx.get_dict("/sim/state")
    if state is None or "kv_capacity_tokens" not in state:
        return
    target.info["simulated"] = True
    if target.kv_tokens is None and positive_int(state.get("kv_capacity_tokens")):
        target.set_capacity(
            "kv_tokens", state["kv_capacity_tokens"], "probed", "/sim/state kv_capacity_tokens"
        )


def _apply_overrides(target: Target, overrides: dict[str, Any]) -> None:
    for name in CAPACITY_NAMES:
        if overrides.get(name) is not None:
            value = positive_int(overrides[name])
            if value is None:
                raise ValueError(f"{name}: {overrides[name]!r} is not a positive integer")
            target.set_capacity(name, value, "given", "given by the user")
    engine = overrides.get("engine")
    if engine:
        target.sources["name"] = "given"
        if str(engine) != target.engine:  # a name no adapter has: the report says it
            target.engine_name = str(engine)
    if overrides.get("engine_version"):
        target.version = str(overrides["engine_version"])
        target.sources["version"] = "given"
    for key in ("commit", "build", "backend", "quantization", "repository"):
        if overrides.get(key):
            setattr(target, key, str(overrides[key]))
            target.sources[key] = "given"
    if overrides.get("model_name"):
        target.model_name = str(overrides["model_name"])
    if "token_id_prompts" in overrides:
        target.token_id_prompts = bool(overrides["token_id_prompts"])
