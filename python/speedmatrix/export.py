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

import contextlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.lib import format as npformat

from speedmatrix.results import load
from speedmatrix.runfile import RECORDS_DIR

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


#: rows per Parquet row group, and per slice of a column read from a records file: the
#: export holds one slice of one cell at a time, whatever the window's length (peak growth
#: for a 2M-event cell: ~45 MB at 64K rows, ~96 MB at 256K; 246 MB for the whole table)
ROWS_PER_GROUP = 1 << 16

_GROUPS = (("requests", "req_", REQUESTS_PARQUET), ("events", "ev_", TOKENS_PARQUET))


def _front_schema():
    return [
        pa.field("cell", pa.string()),
        pa.field("phase", pa.string()),
        pa.field("context", pa.int64()),
        pa.field("concurrency", pa.int64()),
        pa.field("repetition", pa.int64()),
    ]


def _arrow_type(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "U":
        return pa.string()
    if dtype.kind == "S":
        return pa.binary()
    return pa.from_numpy_dtype(dtype)


class _Column:
    """One 1-D array of a cell's records, read in slices of rows: a member of the cell's
    ``.npz`` read piece by piece from the zip stream (the file holds it compressed: loading
    it whole would hold the cell's every row), or an array already in memory."""

    def __init__(self, dtype, n: int, read):
        self.dtype, self.n, self._read = dtype, n, read

    def take(self, rows: int):
        return self._read(rows)


def _npz_columns(path: Path, prefix: str, stack) -> dict[str, _Column]:
    z = stack.enter_context(zipfile.ZipFile(path))
    cols: dict[str, _Column] = {}
    for info in z.infolist():
        name = info.filename
        if not (name.startswith(prefix) and name.endswith(".npy")):
            continue
        f = stack.enter_context(z.open(info))
        version = npformat.read_magic(f)
        read_header = (
            npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        )
        shape, _fortran, dtype = read_header(f)
        if len(shape) != 1 or dtype.hasobject:
            continue  # load_records would refuse it too (allow_pickle=False)

        def read(rows: int, f=f, dtype=dtype):
            data = f.read(rows * dtype.itemsize)
            return np.frombuffer(data, dtype=dtype)

        cols[name[len(prefix) : -len(".npy")]] = _Column(dtype, int(shape[0]), read)
    return cols


def _memory_columns(arrays: dict) -> dict[str, _Column]:
    cols: dict[str, _Column] = {}
    for k, v in arrays.items():
        a = np.asarray(v)
        pos = [0]

        def read(rows: int, a=a, pos=pos):
            out = a[pos[0] : pos[0] + rows]
            pos[0] += rows
            return out

        cols[k] = _Column(a.dtype, len(a), read)
    return cols


def _cells(run):
    """(cell id, cell dict, records file or None, records in memory or None) of each cell
    with saved records, without filling the run's records cache (a report may have)."""
    cache = getattr(run, "_records_cache", {})
    # Run.cells has one row per run.json cell, in order, with the id the records go by
    for cid, c in zip(run.cells["id"].tolist(), run.doc.get("cells") or []):
        if cid in cache:
            if cache[cid] is not None:
                yield cid, c, None, cache[cid]
            continue
        rel = c.get("records")
        path = _records_file(run, rel)
        if path is not None:
            yield cid, c, path, None
        elif rel:
            rec = run.records(cid)  # its checks and warnings (a path outside records/)
            if rec is not None:
                yield cid, c, None, rec


def _records_file(run, rel) -> Path | None:
    """The records file ``rel`` names when it is one inside the run's ``records/``
    (`speedmatrix.runfile.load_records`' rule), else None."""

    if not rel or run.path is None or Path(str(rel)).is_absolute():
        return None
    base = (run.path / RECORDS_DIR).resolve()
    path = (run.path / str(rel)).resolve()
    return path if base in path.parents and path.is_file() else None


def _open_columns(run, cid, path, rec, group: str, prefix: str, stack) -> dict[str, _Column]:
    if rec is not None:
        return _memory_columns(rec[group] or {})

    try:
        return _npz_columns(path, prefix, stack)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        # unreadable: Run.records says so once (a warning) and the cell has no rows
        rec = run.records(cid)
        return _memory_columns(rec[group] or {}) if rec is not None else {}


def _write_group(run, group: str, prefix: str, dest: Path) -> None:
    """One Parquet file of every cell's ``group`` rows, written a row group at a time."""

    # the columns of every cell first (the file has one schema): from the arrays' headers
    fields: dict[str, Any] = {}
    source: dict[str, str] = {}  # exported name -> records column (a coded one as labels)
    for cid, _c, path, rec in _cells(run):
        with contextlib.ExitStack() as stack:
            for k, col in _open_columns(run, cid, path, rec, group, prefix, stack).items():
                name = LABELS[k][0] if k in LABELS else k
                source.setdefault(name, k)
                kind = pa.dictionary(pa.int32(), pa.string()) if k in LABELS else None
                fields.setdefault(name, kind or _arrow_type(col.dtype))
    schema = pa.schema(_front_schema() + [pa.field(k, t) for k, t in fields.items()])
    with pq.ParquetWriter(str(dest), schema, compression="zstd") as writer:
        for cid, c, path, rec in _cells(run):
            front = {
                "cell": cid,
                "phase": c.get("phase"),
                "context": int(c.get("context")),
                "concurrency": int(c.get("concurrency")),
                "repetition": int(c.get("repetition") or 0),
            }
            with contextlib.ExitStack() as stack:
                cols = _open_columns(run, cid, path, rec, group, prefix, stack)
                if not cols:
                    continue
                n = min(col.n for col in cols.values())
                for start in range(0, n, ROWS_PER_GROUP):
                    rows = min(ROWS_PER_GROUP, n - start)
                    arrays = []
                    for field in schema:
                        src = source.get(field.name, "")
                        if field.name in front:
                            value = pa.scalar(front[field.name], field.type)
                            arrays.append(pa.repeat(value, rows))
                        elif src in cols and src in LABELS:
                            arrays.append(labelled(src, cols[src].take(rows))[1])
                        elif src in cols:
                            a = cols[src].take(rows)
                            v = a.tolist() if a.dtype.kind in "US" else np.ascontiguousarray(a)
                            arrays.append(pa.array(v).cast(field.type))
                        else:
                            arrays.append(pa.nulls(rows, field.type))
                    writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
                    del arrays
                    # Arrow's pool (mimalloc) otherwise keeps every freed row group resident:
                    # +15 MB at the end of a 2 M-event cell (test_export), no time measured
                    pa.default_memory_pool().release_unused()


def write_parquet(run, run_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``requests.parquet`` and ``tokens.parquet`` into ``run_dir``, a cell and a row
    group at a time (each file replaced whole: temp file, rename)."""
    d = Path(run_dir)
    out = []
    for group, prefix, name in _GROUPS:
        path = d / name
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            _write_group(run, group, prefix, tmp)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        out.append(path)
    return out[0], out[1]


def _write_bytes(path: Path, data: bytes) -> None:
    """Whole-file replace (temp file, rename), so a reader never sees half an export."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_exports(run_dir: str | os.PathLike, run=None, parquet: bool = True) -> list[Path]:
    """Write every export of the run in ``run_dir``; returns the paths written."""
    d = Path(run_dir)
    run = run if run is not None else load(d)
    paths = [write_cells_csv(run, d / CELLS_CSV)]
    if parquet:
        paths += list(write_parquet(run, d))
    return paths
