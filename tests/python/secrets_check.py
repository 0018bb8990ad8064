"""Finding secrets in a saved run the way a reader would: raw bytes in every text
encoding numpy and Python write (UTF-8, UTF-16, UTF-32), and inside the compressed
``records/*.npz`` files, whose string arrays are opened and decoded one by one (a
deflated UTF-32 array hides its text from a byte search)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ENCODINGS = ("utf-8", "utf-16-le", "utf-32-le")


def _strings(path: Path):
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            yield key, key
            a = z[key]
            if a.dtype.kind in "US":
                for x in a.ravel().tolist():
                    yield key, x.decode("utf-8", "replace") if isinstance(x, bytes) else x


def secrets_found(folder: str | Path, secrets: list[str]) -> list[str]:
    """``"<file>: <where>"`` for every secret seen under ``folder`` (empty: none)."""
    hits = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        data = path.read_bytes()
        for secret in secrets:
            for enc in ENCODINGS:
                if secret.encode(enc) in data:
                    hits.append(f"{path}: {secret!r} as {enc} bytes")
        if path.suffix == ".npz":
            for key, text in _strings(path):
                hits += [f"{path}: {s!r} in array {key}" for s in secrets if s in text]
    return hits


def npz_strings(folder: str | Path) -> list[str]:
    """Every decoded string of every records file under ``folder``."""
    return [t for p in sorted(Path(folder).rglob("*.npz")) for _k, t in _strings(p)]
