"""Names shown for what a server reports: a model path as a model name, a dtype as a
precision. Used by discovery (run metadata) and the report alike."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["display_model_name", "precision_label"]

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
