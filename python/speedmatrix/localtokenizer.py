"""A user-given local tokenizer: counting a text's tokens with it, and loading a Hugging Face
tokenizer by name or path (``transformers`` or ``tokenizers``, neither a dependency)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speedmatrix.errors import SpeedmatrixError

__all__ = ["load_tokenizer", "local_count", "local_ids"]


def local_count(tokenizer: Any, text: str) -> int:
    """Tokens of ``text`` by a local tokenizer: ``encode(text)`` where it has one (Hugging
    Face ``transformers`` / ``tokenizers``: ids, or an Encoding with ``.ids``), else
    ``tokenizer(text)`` giving a count or a list of ids."""
    assert tokenizer is not None
    encode = getattr(tokenizer, "encode", None)
    result = encode(text) if callable(encode) else tokenizer(text)
    if isinstance(result, int):
        return result
    if hasattr(result, "ids"):
        return len(result.ids)
    if isinstance(result, dict) or hasattr(result, "input_ids"):
        return len(result["input_ids"])
    return len(result)


def local_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` by a local tokenizer, no special tokens added (an answer's text
    as it continues a prompt): ``encode(text, add_special_tokens=False)`` (Hugging Face),
    else ``encode(text)`` / ``tokenizer(text)``. TypeError when it gives no ids."""
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        try:
            result = encode(text, add_special_tokens=False)
        except TypeError:  # an encode without that keyword
            result = encode(text)
    else:
        result = tokenizer(text)
    if hasattr(result, "ids"):
        result = result.ids
    elif isinstance(result, dict) or hasattr(result, "input_ids"):
        result = result["input_ids"]
    if not isinstance(result, (list, tuple)):
        raise TypeError(
            f"the local tokenizer gave no token ids for a text: {type(result).__name__}"
        )
    return [int(t) for t in result]


def load_tokenizer(name_or_path: str) -> Any:
    """A Hugging Face tokenizer by hub name or local path (a folder, or a tokenizer.json),
    with ``transformers`` when installed, else ``tokenizers``. Neither is a dependency of
    speedmatrix: without both, a SpeedmatrixError says what to install."""
    try:
        from transformers import AutoTokenizer  # optional: not a dependency (--tokenizer)
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        try:
            return AutoTokenizer.from_pretrained(name_or_path)
        except Exception as exc:  # noqa: BLE001 - any failure to load is the user's to fix
            raise SpeedmatrixError(
                f"tokenizer {name_or_path!r} could not be loaded with transformers: {exc}"
            ) from None
    try:
        from tokenizers import Tokenizer  # optional: not a dependency (--tokenizer)
    except ImportError:
        raise SpeedmatrixError(
            f"tokenizer {name_or_path!r}: a local tokenizer needs the `transformers` or "
            "`tokenizers` package (pip install tokenizers), which is not installed"
        ) from None
    path = Path(name_or_path)
    try:
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return Tokenizer.from_file(str(path / "tokenizer.json"))
        if path.is_file():
            return Tokenizer.from_file(str(path))
        return Tokenizer.from_pretrained(name_or_path)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the user's to fix
        raise SpeedmatrixError(
            f"tokenizer {name_or_path!r} could not be loaded with tokenizers: {exc}"
        ) from None
