"""`speedmatrix.run` and `--resume`: a sweep from Python, and the continuation of a saved
one (under the run folder's lock)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedmatrix import runfile
from speedmatrix.cliargs import UsageError, base_url
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.matrix import Matrix
from speedmatrix.shards.pool import open_pool
from speedmatrix.sweep.runner import Sweep
from speedmatrix.sweep.state import KEPT_ON_RESUME

if TYPE_CHECKING:
    from speedmatrix.results import Run


def run(
    url: str,
    matrix: Matrix,
    out: str | os.PathLike[str] | None = None,
    *,
    api_key: str | None = None,
    model: str | None = None,
    overrides: dict[str, Any] | None = None,
    info: dict[str, Any] | None = None,
    progress: bool = True,
    report: bool = True,
    target: Any = None,
    tokenizer: Any = None,
    probe_running: bool = True,
    ray: str | None = None,
    shards: int | None = None,
) -> Run:
    """Measures `matrix` against the server at `url` and returns the saved run
    (`speedmatrix.results.Run`). `out` defaults to a new temporary folder.

    `api_key`, `model` (the served name; default the server's only or first), `overrides`
    (capacity and engine facts, as the CLI's --kv-capacity, --engine, ...), `info` (report
    metadata: launch_command, hardware, revision), `progress` (the live view), `report`
    (write report.md/html), `target` (a discovered Target: no discovery), `tokenizer` (a
    local tokenizer: `callable(text) -> int | list`, an object with `encode`, or a Hugging
    Face name/path loaded with `transformers`/`tokenizers`), `probe_running` (False: never
    send the short load probe that learns a running cap the server does not publish),
    `ray` (a Ray cluster's address or "auto": each cell's load dealt over `shards` shard
    actors, one per client node, default one per live node; docs/SCALE.md).

    The URL (the CLI's rule: http:// or https://, HOST:PORT as http://) and the matrix are
    checked before anything is sent or written: ValueError naming what is wrong."""

    if not isinstance(matrix, Matrix):
        raise TypeError(f"matrix: a speedmatrix.Matrix, not {type(matrix).__name__}")
    try:
        url = base_url(url, flag="url")
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    matrix.validate()
    if out is None:
        out = tempfile.mkdtemp(prefix="speedmatrix-")
    with open_pool(ray, shards) as pool:
        sweep = Sweep(
            url,
            matrix,
            out,
            api_key=api_key,
            model=model,
            overrides=overrides,
            info=info,
            progress=progress,
            report=report,
            target=target,
            tokenizer=tokenizer,
            probe_running=probe_running,
            shards=pool,
        )
        code = sweep.execute()
    if code == 130:
        raise KeyboardInterrupt
    return sweep.run_result()


def resume(
    out: str | os.PathLike,
    *,
    api_key: str | None = None,
    progress: bool = True,
    report: bool = True,
    tokenizer=None,
    client=None,
    force: bool = False,
    ray: str | None = None,
    shards: int | None = None,
) -> int:
    """Continues the interrupted run saved in `out`: cells already in run.json are kept
    (those left unrun when the server stopped answering are measured now). ``client``: how
    to reach the server (a ClientConfig: key, Basic auth, TLS); the saved URL has none.
    A server whose engine, version, model or limits differ from the saved run's is refused
    unless ``force`` (the difference is then recorded in the run's warnings). ``ray`` and
    ``shards``: the cells left run on shards, as `run`'s."""
    out = Path(out)
    _saved_run(out)  # a folder without a run is said before any lock file is made in it
    # the lock covers reading the saved run too: a resume never continues a stale copy
    with runfile.run_lock(out, "run --resume"), open_pool(ray, shards) as pool:
        return _resume_locked(
            out, _saved_run(out), api_key, progress, report, tokenizer, client, force, pool
        )


def _saved_run(out: Path) -> dict:
    try:
        return runfile.read_run(out)
    except (FileNotFoundError, ValueError) as exc:
        raise SpeedmatrixError(f"cannot resume {out}: {exc}") from exc


def _resume_locked(
    out: Path,
    doc: dict,
    api_key,
    progress: bool,
    report: bool,
    tokenizer,
    client,
    force: bool,
    pool=None,
) -> int:
    meta = doc["meta"]
    matrix = Matrix.from_dict(meta["run"]["matrix"])
    given = {
        k: v["value"]
        for k, v in meta.get("capacity", {}).items()
        if isinstance(v, dict) and v.get("source") == "given"
    }
    redo = [
        c.get("id", "?")
        for c in doc.get("cells", [])
        if c.get("not_run") or c.get("status") not in KEPT_ON_RESUME
    ]
    if redo:  # said even with --quiet: those cells' saved figures will be replaced
        print(
            f"speedmatrix: --resume measures again {len(redo)} cell(s) not valid: "
            + ", ".join(redo[:12])
            + (f" and {len(redo) - 12} more" if len(redo) > 12 else ""),
            file=sys.stderr,
        )
    sweep = Sweep(
        meta["target"]["url"],
        matrix,
        out,
        api_key=api_key,
        model=meta["target"].get("model"),
        overrides=given,
        progress=progress,
        report=report,
        resume_doc=doc,
        tokenizer=tokenizer,
        client=client,
        force=force,
        shards=pool,
    )
    return sweep.execute()
