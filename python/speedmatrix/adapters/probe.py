"""What adapters probe with: `ProbeContext` (the client, the /v1/models answer, cached
GETs) and the Prometheus page reader (`_core.parse_prometheus`, the one parser: the
sampler during a cell uses the same C++ code)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from speedmatrix._native import _core
from speedmatrix.http import ConnectError, HttpClient, HttpError


class Owned(Protocol):
    """What `ProbeContext.owned_by_matches` reads of an adapter (registry.Adapter has it);
    a protocol, so that the registry imports this module and not the other way round."""

    @property
    def owned_by(self) -> Iterable[str]: ...


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

    def owned_by_matches(self, adapter: Owned) -> bool:
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


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of Prometheus text exposition: ``[(name, labels, value), ...]`` (the C++
    parser the in-cell sampler uses). Raises ValueError when a line is not a sample, a
    comment or blank: such a page is not Prometheus text."""
    return [(n, dict(labels), float(v)) for n, labels, v in _core.parse_prometheus(text, True)]
