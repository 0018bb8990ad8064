"""Engine adapters and server discovery.

``discover(url)`` returns a :class:`Target`; ``register_adapter`` adds an engine.
Built-in adapters, in probing order: vLLM, SGLang, TensorRT-LLM, LMDeploy, llama.cpp, TGI,
Ollama; the generic OpenAI adapter is the fallback.
"""

from __future__ import annotations

from speedmatrix.adapters.base import (
    CAPACITY_NAMES,
    PROBE_KEYS,
    Adapter,
    Capacity,
    MetricsSpec,
    OutputControl,
    ProbeContext,
    Target,
    TokenizeSpec,
    adapter_names,
    parse_prometheus,
    read_load,
    register_adapter,
    registered_adapters,
    strip_credentials,
    unregister_adapter,
)
from speedmatrix.adapters.discovery import (
    OVERRIDE_KEYS,
    ModelNotServedError,
    discover,
    get_adapter,
    normalise_url,
)
from speedmatrix.adapters.generic import GenericAdapter
from speedmatrix.adapters.llamacpp import LlamaCppAdapter
from speedmatrix.adapters.lmdeploy import LMDeployAdapter
from speedmatrix.adapters.ollama import OllamaAdapter
from speedmatrix.adapters.sglang import SGLangAdapter
from speedmatrix.adapters.tgi import TGIAdapter
from speedmatrix.adapters.trtllm import TRTLLMAdapter
from speedmatrix.adapters.vllm import VLLMAdapter

BUILTIN_ADAPTERS = (
    VLLMAdapter,
    SGLangAdapter,
    TRTLLMAdapter,
    LMDeployAdapter,
    LlamaCppAdapter,
    TGIAdapter,
    OllamaAdapter,
)
for _cls in BUILTIN_ADAPTERS:
    if _cls.name not in adapter_names():
        register_adapter(_cls, first=False)

__all__ = [
    "BUILTIN_ADAPTERS",
    "CAPACITY_NAMES",
    "OVERRIDE_KEYS",
    "PROBE_KEYS",
    "Adapter",
    "Capacity",
    "GenericAdapter",
    "LMDeployAdapter",
    "LlamaCppAdapter",
    "MetricsSpec",
    "ModelNotServedError",
    "OllamaAdapter",
    "OutputControl",
    "ProbeContext",
    "SGLangAdapter",
    "TGIAdapter",
    "TRTLLMAdapter",
    "Target",
    "TokenizeSpec",
    "VLLMAdapter",
    "adapter_names",
    "discover",
    "get_adapter",
    "normalise_url",
    "parse_prometheus",
    "read_load",
    "register_adapter",
    "registered_adapters",
    "strip_credentials",
    "unregister_adapter",
]
