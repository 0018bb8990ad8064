"""Saved runs on disk: ``DIR/run.json`` and ``DIR/records/<cell id>.npz``.

``write_run`` is atomic (temp file in the same folder, fsync, ``os.replace``), so
a reader never sees half a file and a crash loses at most the cell in progress; a write
that fails (a full disk above all) leaves the previous file as it was and raises a one-line
:class:`RunFileError`. Files get mode 0666 less the umask (0644 usually), as ``open`` would
give, not mkstemp's 0600. ``read_run`` checks the ``speedmatrix.run/1`` contract and names
what is missing; ``load_records`` refuses a records path outside the run's ``records/``.

One writer at a time: ``run_lock`` holds an exclusive ``flock`` on ``DIR/.speedmatrix.lock``
for a run's life (a new run, ``--resume``) and around ``write_run`` (``recompute --write``)
and report writes; a second writer gets a one-line :class:`RunLockedError` naming the holder
(pid, host, command, start time) and writes nothing. The kernel drops the lock when its
holder dies, even by ``kill -9``: a stale lock file never blocks anyone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from speedmatrix.errors import SpeedmatrixError
from speedmatrix.npzwrite import savez_streamed
from speedmatrix.redact import redact, redact_known
from speedmatrix.schema import check

SCHEMA = "speedmatrix.run/1"
RUN_FILE = "run.json"
RECORDS_DIR = "records"
#: the lock file of a run folder (hidden; removed by its holder when it lets go)
LOCK_FILE = ".speedmatrix.lock"

#: the figures of DESIGN.md's cell contract (each may be null)
CELL_FIGURES = (
    "total_tok_s",
    "per_request_tok_s",
    "prompt_tok_s",
    "ttft_ms",
    "tbt_ms",
    "avg_active",
)
# DESIGN.md's cell contract: every cell carries these (figures may be null).
REQUIRED_CELL_FIELDS = (
    "phase",
    "context",
    "concurrency",
    "status",
    *CELL_FIGURES,
    "completed",
    "output_tokens",
    "measured_s",
    "errors",
)
PHASES = ("prefill", "decode", "interference", "session")
STATUSES = ("valid", "queued", "over_capacity", "error")


class RunFileError(SpeedmatrixError, ValueError):
    """A saved run that cannot be read or written: the message names the file and the field."""


class RunLockedError(RunFileError):
    """Another process is writing this run folder (it holds its lock)."""


#: the run folders this process holds: resolved path -> [fd, depth] (the lock is re-entrant
#: within a process: a sweep's own run.json and report writes pass under its lock)
_held: dict[str, list[int]] = {}
_held_guard = threading.Lock()


#: how long a refused writer waits for a holder that has just taken the lock to write who
#: it is (it does so at once after ``flock``); past this the holder is named generically
_HOLDER_WAIT_S = 0.5


def _holder(path: Path) -> str:
    """Who holds the lock, as its holder wrote it in the lock file."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        try:
            info = json.loads(path.read_text(encoding="utf-8")[:4096])
            pid, host = int(info["pid"]), str(info["host"])[:64]
            what = str(info.get("command", "speedmatrix"))[:40]
            return f"pid {pid} on {host}, `speedmatrix {what}` started {str(info['started'])[:32]}"
        except (OSError, ValueError, KeyError, TypeError):  # being written at this moment
            if time.monotonic() >= deadline:
                return "another speedmatrix process"
            time.sleep(0.01)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, command: str = "run") -> Iterator[None]:
    """Holds the exclusive lock of ``run_dir`` (made if absent) while the block runs; raises
    RunLockedError at once when another process holds it. Re-entrant within a process."""
    d = Path(run_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
        key = str(d.resolve())
    except OSError as exc:
        raise RunFileError(f"cannot make {d}: {exc.strerror or exc}") from None
    with _held_guard:
        if key in _held:
            _held[key][1] += 1
            fd = None
        else:
            fd = _acquire(d / LOCK_FILE, command)
            _held[key] = [fd, 1]
    try:
        yield
    finally:
        with _held_guard:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                fd = _held.pop(key)[0]
                with contextlib.suppress(OSError):
                    # unlinked while still locked: a process waiting on this inode finds
                    # it gone and opens the next one (see _acquire)
                    os.unlink(d / LOCK_FILE)
                os.close(fd)


#: the temporary files our writers make and a kill -9 leaves behind: ``atomic_write``'s
#: ``.<file>.<8 random>.tmp`` (run.json, the report, plots) and the exports'
#: ``.<file>.tmp``, each of a file type we write; ``save_records``'
#: ``.<cell>.<8 random>.npz`` in records/
_STALE_TMP = re.compile(r"^\..+\.(?:json|md|html|svg|csv|parquet)(?:\.[a-z0-9_]{8})?\.tmp$")
_STALE_NPZ = re.compile(r"^\..+\.[a-z0-9_]{8}\.npz$")


def clean_stale_temp(run_dir: str | os.PathLike) -> list[str]:
    """Removes the temporary files an interrupted write left in ``run_dir`` (its own
    folder, ``plots/`` and ``records/``), only those of our own name patterns; returns
    their paths relative to ``run_dir``. Call it holding the folder's lock: no writer of
    ours is then at work in it."""
    d = Path(run_dir)
    removed = []
    for sub, pattern in (("", _STALE_TMP), ("plots", _STALE_TMP), (RECORDS_DIR, _STALE_NPZ)):
        try:
            entries = list(os.scandir(d / sub))
        except OSError:
            continue
        for e in entries:
            if pattern.match(e.name) and e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
                    removed.append(f"{sub}/{e.name}" if sub else e.name)
    return sorted(removed)


def ensure_unlocked(run_dir: str | os.PathLike) -> None:
    """Raises RunLockedError when another process holds ``run_dir`` (before moving it)."""
    with run_lock(run_dir, "check"):
        pass


def _acquire(path: Path, command: str) -> int:
    for _ in range(50):  # each turn lost to a holder unlinking as it let go
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise RunFileError(f"cannot lock {path.parent}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunLockedError(
                f"{path.parent} is in use by {_holder(path)}; nothing was written (wait for it "
                "to end, or choose another folder)"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the file we locked was unlinked by its last holder: open the new one
            os.close(fd)
            continue
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        return fd
    raise RunLockedError(f"{path.parent}: its lock changes hands too fast; try again")


def _umask() -> int:
    mask = os.umask(0o022)  # read it: the only way; set back at once
    os.umask(mask)
    return mask


def _file_mode() -> int:
    return 0o666 & ~_umask()


def _write_failed(path: Path, exc: OSError) -> RunFileError:
    why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror
    return RunFileError(f"cannot write {path}: {why or exc}; the previous file is kept")


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null, numpy scalars and arrays become Python values."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_clean(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def atomic_write(path: Path, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file and a rename: a reader sees the
    old file or the new one, never a part. A failed write (a full disk) removes the
    temporary file, keeps the old one, and raises a one-line RunFileError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_failed(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _file_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise _write_failed(path, exc) from exc
        raise


def _redact_strings(obj: Any, fn) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _redact_strings(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redact_strings(v, fn) for v in obj]
    return obj


def as_saved(run: dict, secrets: list[str] | None = None) -> dict:
    """``run`` as `write_run` stores it (and `read_run` gives it back): JSON values only,
    NaN as null, every string redacted, ``secrets`` replaced."""

    doc = _clean(run)
    doc.setdefault("schema", SCHEMA)
    doc.setdefault("meta", {})
    doc.setdefault("cells", [])
    doc = _redact_strings(doc, redact)
    if secrets:
        doc = redact_known(doc, secrets)
    return json.loads(json.dumps(doc, allow_nan=False))


def write_run(run_dir: str | os.PathLike, run: dict, secrets: list[str] | None = None) -> Path:
    """Write ``run`` as ``run_dir/run.json`` atomically and return its path.

    The schema field is filled in when absent. Every string (launch command,
    target URL, error messages, reasons) is passed through
    :func:`speedmatrix.redact.redact`, and ``secrets`` (API keys, tokens) are
    replaced by ``<redacted>`` anywhere in the document.
    """
    doc = as_saved(run, secrets)
    path = Path(run_dir) / RUN_FILE
    text = json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    with run_lock(run_dir, "write"):
        atomic_write(path, text.encode("utf-8"))
    return path


def validate_run(doc: Any, source: str = RUN_FILE, strict: bool = True) -> dict:
    """Check the ``speedmatrix.run/1`` contract; raise :class:`RunFileError` naming the problem.

    ``strict`` requires every DESIGN.md cell field; otherwise only the fields that
    identify a cell (phase, context, concurrency, status) are required.
    """
    if not isinstance(doc, dict):
        raise RunFileError(f"{source}: expected a JSON object, got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema is None:
        raise RunFileError(f"{source}: missing field 'schema' (expected {SCHEMA!r})")
    if schema != SCHEMA:
        raise RunFileError(f"{source}: unsupported schema {schema!r} (expected {SCHEMA!r})")
    if not isinstance(doc.get("meta", {}), dict):
        raise RunFileError(f"{source}: field 'meta' must be an object")
    cells = doc.get("cells")
    if cells is None:
        raise RunFileError(f"{source}: missing field 'cells'")
    if not isinstance(cells, list):
        raise RunFileError(f"{source}: field 'cells' must be a list")
    required = REQUIRED_CELL_FIELDS if strict else REQUIRED_CELL_FIELDS[:4]
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise RunFileError(f"{source}: cells[{i}] must be an object")
        name = f"cells[{i}]" + (f" ({cell['id']})" if "id" in cell else "")
        for field in required:
            if field not in cell:
                raise RunFileError(f"{source}: {name} is missing field {field!r}")
        if cell["phase"] not in PHASES:
            raise RunFileError(
                f"{source}: {name} field 'phase' is {cell['phase']!r}, expected one of {PHASES}"
            )
        if cell["status"] not in STATUSES:
            raise RunFileError(
                f"{source}: {name} field 'status' is {cell['status']!r}, expected one of {STATUSES}"
            )
        for field in ("context", "concurrency"):
            if not isinstance(cell[field], int) or isinstance(cell[field], bool):
                raise RunFileError(f"{source}: {name} field {field!r} must be an integer")
    return doc


def read_run(run_dir: str | os.PathLike, strict: bool = True) -> dict:
    """Read and validate ``run_dir/run.json`` (or a path to the file itself)."""
    p = Path(run_dir)
    path = p if p.suffix == ".json" and p.is_file() else p / RUN_FILE
    if not path.is_file():
        if not p.exists():
            raise FileNotFoundError(f"no saved run at {p}: the folder does not exist")
        raise FileNotFoundError(f"no saved run at {p}: {RUN_FILE} is missing")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise RunFileError(f"{path}: not a run file (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        what = "empty" if not path.stat().st_size else f"not valid JSON ({exc})"
        raise RunFileError(f"{path}: {what}; it is not a complete run file") from None
    except OSError as exc:
        raise RunFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    validate_run(doc, str(path), strict=strict)
    if strict:  # the published schema's types too: a hand-edited field is one line, not a bug
        check(doc, str(path))
    return doc


def _records_relpath(cell_id: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(cell_id))
    return f"{RECORDS_DIR}/{safe}.npz"


def _as_array(v: Any) -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
        return np.asarray(v, dtype=np.str_)
    return np.asarray(v)


def _redact_array(a: np.ndarray, fn) -> np.ndarray:
    """A string array with ``fn`` applied to every element; other arrays unchanged."""
    if a.dtype.kind == "U":
        return np.asarray([fn(x) for x in a.ravel().tolist()], dtype=np.str_).reshape(a.shape)
    if a.dtype.kind == "S":
        out = [fn(x.decode("utf-8", "replace")).encode("utf-8") for x in a.ravel().tolist()]
        return np.asarray(out, dtype=np.bytes_).reshape(a.shape)
    return a


def save_records(
    run_dir: str | os.PathLike,
    cell_id: str,
    requests: dict,
    events: dict,
    metrics: dict | None = None,
    secrets: list[str] | None = None,
    stamps: dict | None = None,
) -> str:
    """Save one cell's raw records as ``records/<cell id>.npz``; return the relative path.

    Arrays are stored as ``req_<name>``, ``ev_<name>``, and ``met_names``,
    ``met_t_ns``, ``met_values`` (plus ``met_failures``), and the cell's clock stamps and
    client figures (``stamps``: window_start_ns, window_end_ns, warmup_start_ns, end_ns,
    client_cpu_s, loop_lag_max_ms, fatal_error) as ``cell_<name>`` scalars; strings as
    unicode arrays.
    Every string (the servers' error messages above all: a server may echo a key or a
    header) passes through :func:`speedmatrix.redact.redact`, and ``secrets`` are replaced
    by ``<redacted>``, as in run.json.
    """

    def clean(text: str) -> str:
        return redact_known(redact(text), secrets) if secrets else redact(text)

    arrays: dict[str, np.ndarray] = {}
    for k, v in (requests or {}).items():
        arrays[f"req_{k}"] = _redact_array(_as_array(v), clean)
    for k, v in (events or {}).items():
        arrays[f"ev_{k}"] = _redact_array(_as_array(v), clean)
    metrics = metrics or {}
    names = [str(n) for n in metrics.get("names", [])]
    arrays["met_names"] = np.asarray(names, dtype=np.str_)
    arrays["met_t_ns"] = np.asarray(metrics.get("t_ns", []), dtype=np.int64)
    values = np.asarray(metrics.get("values", []), dtype=np.float64)
    arrays["met_values"] = values.reshape(len(arrays["met_t_ns"]), len(names))
    arrays["met_failures"] = np.asarray(int(metrics.get("failures", 0) or 0))
    for k, v in (stamps or {}).items():
        a = np.asarray(clean(v) if isinstance(v, str) else v)
        arrays[f"cell_{k}"] = a.astype(np.str_) if isinstance(v, str) else a
    for k, a in arrays.items():
        if a.dtype == object:
            raise RunFileError(f"records for {cell_id}: array {k!r} has Python objects")
    rel = _records_relpath(cell_id)
    path = Path(run_dir) / rel
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".npz", dir=path.parent)
        os.fchmod(fd, _file_mode())
        os.close(fd)
    except OSError as exc:
        raise _write_failed(path, exc) from exc
    try:
        savez_streamed(tmp, arrays)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _write_failed(path, exc) from exc
        raise
    return rel


def load_records(run_dir: str | os.PathLike, relpath: str) -> dict:
    """Load a cell's records: ``{"requests": {...}, "events": {...}, "metrics": {...},
    "stamps": {...}}`` (stamps empty in runs saved before they were stored).

    ``relpath`` comes from run.json, which anyone may have edited: it must name a file inside
    the run's ``records/`` folder (no absolute path, no ``..``, no symlink out)."""
    base = (Path(run_dir) / RECORDS_DIR).resolve()
    path = (Path(run_dir) / str(relpath)).resolve()
    if Path(str(relpath)).is_absolute() or base not in path.parents:
        raise RunFileError(
            f"{Path(run_dir) / RUN_FILE}: records path {str(relpath)!r} is outside "
            f"{RECORDS_DIR}/; not read"
        )
    if not path.is_file():
        raise FileNotFoundError(f"records file missing: {path}")
    requests: dict[str, np.ndarray] = {}
    events: dict[str, np.ndarray] = {}
    stamps: dict[str, Any] = {}
    metrics: dict[str, Any] = {
        "names": [],
        "t_ns": np.zeros(0, np.int64),
        "values": np.zeros((0, 0)),
        "failures": 0,
    }
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            a = z[key]
            if key.startswith("req_"):
                requests[key[4:]] = a
            elif key.startswith("ev_"):
                events[key[3:]] = a
            elif key == "met_names":
                metrics["names"] = [str(x) for x in a.tolist()]
            elif key == "met_failures":
                metrics["failures"] = int(a)
            elif key.startswith("met_"):
                metrics[key[4:]] = a
            elif key.startswith("cell_"):
                stamps[key[5:]] = a.item()
    return {"requests": requests, "events": events, "metrics": metrics, "stamps": stamps}
