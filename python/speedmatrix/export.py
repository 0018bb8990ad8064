"""Open exports of a saved run, beside ``run.json``: files any tool reads.

- ``cells.csv`` — one row per cell, the figures of ``run.json`` (nested fields flattened
  as :attr:`speedmatrix.results.Run.cells` does: ``server_running_mean``, ``ci`` bounds as
  ``total_tok_s_lo``/``_hi``; ``errors`` and ``flags`` as JSON text). A spreadsheet opens it.
- ``requests.parquet`` — every saved request of every cell, the raw record columns as the
  runner wrote them (``sent_ns``, ``first_token_ms`` … on the client's monotonic clock in
  ns, ``output_tokens`` …) with the cell's ``cell``, ``phase``, ``context``,
  ``concurrency`` and ``repetition`` in front. The coded columns are written as labels
  (dictionary-encoded strings, categoricals in pandas): ``outcome`` (``ok``, ``cancelled``,
  ``error``, ``pending``), ``token_source`` (``none``, ``chunks``, ``usage_final``,
  ``usage_continuous``) and the request's own phase as ``request_phase`` (``warmup``,
  ``window``), beside the cell's ``phase`` (``prefill``, ``decode``).
- ``tokens.parquet`` — every token event (``request``, ``t_ns``, ``tokens``) of every cell,
  with the same cell columns.

The Parquet files are written with pyarrow and read by DuckDB
(``SELECT * FROM 'DIR/requests.parquet'``), Polars (``pl.read_parquet``), pandas and any
Arrow reader. The ``records/*.npz`` files stay the run's own store (and old runs, which
have only those, still load); the exports are derived from them and can be rewritten at
any time with ``speedmatrix report DIR``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CELLS_CSV = "cells.csv"
REQUESTS_PARQUET = "requests.parquet"
TOKENS_PARQUET = "tokens.parquet"

#: the cell columns put in front of every record row
CELL_KEYS = ("cell", "phase", "context", "concurrency", "repetition")
#: the labels of the records' coded columns, by code (cpp/include/speedmatrix/records.hpp
#: Outcome and Phase, openai.hpp TokenSource), and the name each is exported under
LABELS = {
    "outcome": ("outcome", ("pending", "ok", "cancelled", "error")),
    "token_source": ("token_source", ("none", "chunks", "usage_final", "usage_continuous")),
    "phase": ("request_phase", ("warmup", "window")),
}


def labelled(name: str, codes: Any) -> tuple[str, Any]:
    """(exported name, pyarrow array) of a record column: a coded column as its labels
    (dictionary-encoded; an unknown code keeps its number as text), any other as it is."""
    import numpy as np
    import pyarrow as pa

    a = np.asarray(codes)
    if name not in LABELS:
        return name, pa.array(a.tolist() if a.dtype.kind in "US" else a)
    out_name, labels = LABELS[name]
    a = a.astype(np.int64)
    unknown = sorted(set(a[(a < 0) | (a >= len(labels))].tolist()))
    idx = a.astype(np.int32)
    for j, u in enumerate(unknown):
        idx[a == u] = len(labels) + j
    dictionary = pa.array([*labels, *(str(u) for u in unknown)])
    return out_name, pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), dictionary)


def _jsonish(v: Any) -> Any:
    """A dict or list cell value as compact JSON text (CSV has no nesting)."""
    import numpy as np

    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, separators=(",", ":"), sort_keys=True)
    return v


def cells_frame(run):
    """The cells as written to cells.csv: :attr:`Run.cells` with nested values as JSON."""
    df = run.cells.copy()
    for col in df.columns:
        if df[col].dtype == object:
            df[col] = df[col].map(_jsonish)
    return df


def write_cells_csv(run, path: str | os.PathLike) -> Path:
    path = Path(path)
    _write_bytes(path, cells_frame(run).to_csv(index=False).encode("utf-8"))
    return path


def _record_tables(run):
    """(requests, tokens) pyarrow Tables of every cell with saved records."""
    import pyarrow as pa

    req_parts, ev_parts = [], []
    # Run.cells has one row per run.json cell, in order, with the id the records go by
    for cid, c in zip(run.cells["id"].tolist(), run.doc.get("cells") or []):
        rec = run.records(cid)
        if rec is None:
            continue
        front = {
            "cell": cid,
            "phase": c.get("phase"),
            "context": int(c.get("context")),
            "concurrency": int(c.get("concurrency")),
            "repetition": int(c.get("repetition") or 0),
        }
        for arrays, parts in ((rec["requests"], req_parts), (rec["events"], ev_parts)):
            if not arrays:
                continue
            n = len(next(iter(arrays.values())))
            cols: dict[str, Any] = {}
            for k, v in front.items():
                cols[k] = pa.array([v] * n)
            for k, v in arrays.items():
                name, col = labelled(k, v)
                cols[name] = col
            parts.append(pa.table(cols))
    return _concat(req_parts), _concat(ev_parts)


def _concat(parts):
    import pyarrow as pa

    if not parts:
        return pa.table({k: pa.array([], pa.string()) for k in CELL_KEYS})
    return pa.concat_tables(parts, promote_options="default")


def _write_bytes(path: Path, data: bytes) -> None:
    """Whole-file replace (temp file, rename), so a reader never sees half an export."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_parquet(run, run_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``requests.parquet`` and ``tokens.parquet`` into ``run_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = Path(run_dir)
    out = []
    for table, name in zip(_record_tables(run), (REQUESTS_PARQUET, TOKENS_PARQUET)):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        path = d / name
        _write_bytes(path, sink.getvalue().to_pybytes())
        out.append(path)
    return out[0], out[1]


def write_exports(run_dir: str | os.PathLike, run=None, parquet: bool = True) -> list[Path]:
    """Write every export of the run in ``run_dir``; returns the paths written."""
    from speedmatrix.results import load

    d = Path(run_dir)
    run = run if run is not None else load(d)
    paths = [write_cells_csv(run, d / CELLS_CSV)]
    if parquet:
        paths += list(write_parquet(run, d))
    return paths
