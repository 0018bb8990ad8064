"""`speedmatrix run`: flags -> Matrix, target overrides and report metadata -> the sweep
(or the dry run), and the run's exit status."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from speedmatrix import dryrun, http, runfile, sweep
from speedmatrix.cli.common import api_key_of
from speedmatrix.cli.ray_flags import ray_options
from speedmatrix.cli.run_flags import MATRIX_FLAGS, META_KEYS
from speedmatrix.cli.sparse_flags import apply_sparse_flags
from speedmatrix.cli.traffic_flags import apply_traffic_flags
from speedmatrix.cliargs import (
    UsageError,
    base_url,
    csv_list,
    parse_client_threads,
    positive_int,
)
from speedmatrix.errors import SpeedmatrixError
from speedmatrix.latency import parse_percentiles
from speedmatrix.matrix import (
    Matrix,
    parse_arrival,
    parse_contexts,
    parse_precision,
    preset_record,
    toml_fields,
)
from speedmatrix.runfile import ensure_unlocked
from speedmatrix.shards.pool import open_pool
from speedmatrix.slo import parse_attainment, parse_slo
from speedmatrix.units import parse_duration, parse_tokens
from speedmatrix.verdict import exit_status
from speedmatrix.workload import load_prompts

#: descriptors a run needs beyond one per stream: discovery, /metrics, files, libcurl's own
FD_MARGIN = 64


def matrix_from_args(args: argparse.Namespace):
    try:
        if args.matrix is not None:
            if not args.matrix.is_file():
                raise UsageError(f"--matrix: no such file {args.matrix}")
            try:
                m = Matrix.from_toml(args.matrix)
            except UnicodeDecodeError:
                raise UsageError(f"--matrix {args.matrix}: not UTF-8 text") from None
            except OSError as exc:
                raise UsageError(f"--matrix {args.matrix}: {exc.strerror or exc}") from None
            except ValueError as exc:
                raise UsageError(f"--matrix {args.matrix}: {exc}") from None
        elif args.preset:
            m = Matrix.preset(args.preset)
        else:
            m = Matrix()
        if args.contexts:
            m.contexts = parse_contexts(",".join(csv_list(args.contexts)))
        if args.prefill_contexts:
            if args.prefill_contexts.strip().lower() == "none":
                m.prefill_contexts = []  # a preset's or a file's prefill cells dropped
            else:
                m.prefill_contexts = parse_contexts(
                    ",".join(csv_list(args.prefill_contexts)), prefill=True
                )
        if args.concurrency:
            m.concurrency = [positive_int(c, "--concurrency") for c in csv_list(args.concurrency)]
        if args.duration:
            m.duration_s = parse_duration(args.duration)
        if args.precision:
            m.precision = parse_precision(args.precision)
        if args.min_duration:
            m.min_duration_s = parse_duration(args.min_duration)
        if args.max_output:
            m.max_output = parse_tokens(args.max_output)
        if args.api:
            m.api = args.api
        if args.client_threads:
            m.client_threads = parse_client_threads(args.client_threads)
        if args.repetitions is not None:
            m.repetitions = args.repetitions
        if args.shared_prefix:
            text = args.shared_prefix.strip()
            neg = text.startswith("-")
            m.shared_prefix = -parse_tokens(text[1:]) if neg else parse_tokens(text)
        if args.extra_body:
            extra = json.loads(args.extra_body)
            if not isinstance(extra, dict):
                raise UsageError("--extra-body must be a JSON object")
            m.extra_body = extra
        apply_open_loop_flags(m, args)
        apply_traffic_flags(m, args)
        apply_sparse_flags(m, args)
        m.validate()
    except UsageError:
        raise
    except json.JSONDecodeError as exc:
        raise UsageError(f"--extra-body is not valid JSON: {exc.msg}") from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return m


def apply_open_loop_flags(m, args: argparse.Namespace) -> None:
    """The open-loop and SLO flags onto matrix ``m`` (ValueError names the flag)."""

    if getattr(args, "request_rate", None):
        rates = []
        for item in csv_list(args.request_rate):
            try:
                rates.append(float(item))
            except ValueError:
                raise UsageError(f"--request-rate: {item!r} is not a number") from None
        m.request_rates = rates
    if getattr(args, "arrival", None):
        try:
            parse_arrival(args.arrival)
        except ValueError as exc:
            raise UsageError(f"--arrival: {exc}") from None
        m.arrival = args.arrival.strip().lower()
    if getattr(args, "max_concurrency", None):
        m.max_concurrency = positive_int(args.max_concurrency, "--max-concurrency")
    if getattr(args, "drain_timeout", None):
        m.drain_timeout_s = parse_duration(args.drain_timeout)
    if getattr(args, "percentiles", None):
        m.percentiles = list(parse_percentiles(args.percentiles))
    if getattr(args, "slo", None):
        m.slo = parse_slo(args.slo)
    if getattr(args, "attainment", None):
        m.attainment = parse_attainment(args.attainment)
    if getattr(args, "search", None):
        m.search = args.search
    if getattr(args, "prompts", None):
        load_prompts(args.prompts)  # a bad file is one line now, before any work
        m.prompts_file = str(Path(args.prompts).resolve())


def matrix_sources(args: argparse.Namespace) -> dict[str, str]:
    """Where each matrix field in force came from: ``default``, ``preset NAME`` (a field
    the preset sets otherwise than the default), ``file NAME`` (a key of --matrix) or the
    flag (``--precision``); the flag wins over the file, the file over the preset."""

    names = [f.name for f in fields(Matrix)]
    out = dict.fromkeys(names, "default")
    if args.matrix is not None:
        for name in toml_fields(args.matrix):
            out[name] = f"file {args.matrix.name}"
    elif args.preset:
        preset, plain = Matrix.preset(args.preset), Matrix()
        for name in names:
            if getattr(preset, name) != getattr(plain, name):
                out[name] = f"preset {args.preset}"
    for attr, name, flag in MATRIX_FLAGS:
        if getattr(args, attr, None) not in (None, ""):
            out[name] = flag
    return out


def target_overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    try:
        if args.kv_capacity:
            out["kv_tokens"] = parse_tokens(args.kv_capacity)
        if args.context_length:
            out["context_length"] = parse_tokens(args.context_length)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.max_running is not None:
        out["max_running"] = positive_int(str(args.max_running), "--max-running")
    # Engine facts go to discovery, which records them with source "given".
    for key, value in (
        ("engine", args.engine),
        ("engine_version", args.engine_version),
        ("commit", args.engine_commit),
        ("backend", args.backend),
        ("build", args.build),
        ("repository", args.repository),
        ("quantization", args.quantization),
        ("model_name", args.model_name),
    ):
        if value:
            out[key] = value
    return out


def apply_meta(args: argparse.Namespace) -> None:
    """``--meta KEY=VALUE`` into the flag of that name, unless the flag itself was given."""
    for item in args.meta:
        key, sep, value = item.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"--meta {item!r}: expected KEY=VALUE")
        if key not in META_KEYS:
            raise UsageError(f"--meta: unknown key {key!r}; keys: {', '.join(META_KEYS)}")
        if getattr(args, key, None) in (None, ""):
            setattr(args, key, value)


def command(args: argparse.Namespace) -> int:
    apply_meta(args)
    api_key = api_key_of(args)
    if args.ca_file is not None and not args.ca_file.is_file():
        raise UsageError(f"--ca-file: no such file {args.ca_file}")
    # one client configuration (key, the URL's credentials, TLS) for discovery and core alike
    client = http.ClientConfig.make(args.url, api_key, ca_file=args.ca_file, insecure=args.insecure)
    if args.dry_run:
        return _dry_run(args, api_key, client)
    if args.resume is not None:
        return _resume(args, api_key, client)
    return _new_run(args, api_key, client)


def _dry_run(args: argparse.Namespace, api_key: str | None, client: Any) -> int:
    if args.resume is not None:
        raise UsageError("--dry-run plans a new run; it does not take --resume")
    if not args.url:
        raise UsageError("--url is required")

    url = base_url(args.url)
    matrix = matrix_from_args(args)
    print(
        dryrun.describe(
            url,
            matrix,
            api_key=api_key,
            model=args.model,
            overrides=target_overrides(args),
            tokenizer=args.tokenizer,
            sources=matrix_sources(args),
            client=client,
        )
    )
    return 0


def _resume(args: argparse.Namespace, api_key: str | None, client: Any) -> int:
    address, shards = ray_options(args)
    doc = runfile.read_run(args.resume)
    conc = ((doc.get("meta") or {}).get("run") or {}).get("matrix", {}).get("concurrency")
    ensure_descriptors(max(conc or [1]))
    sweep.resume(
        args.resume,
        api_key=api_key,
        progress=not args.quiet,
        report=not args.no_report,
        tokenizer=args.tokenizer,
        client=client,
        force=args.force,
        ray=address,
        shards=shards,
    )
    return run_exit_status(runfile.read_run(args.resume, strict=False))


def _report_info(args: argparse.Namespace, matrix: Any) -> dict[str, Any]:
    """What the report says about the setup (the metadata flags), and how the matrix
    differs from the preset it started from."""
    info: dict[str, Any] = {
        "launch_command": args.launch_command,
        "hardware": {
            k: v
            for k, v in (
                ("gpu", args.gpu),
                ("vram", args.vram),
                ("type", args.hardware_type),
                ("os", args.os),
            )
            if v
        },
        "revision": args.revision,
    }
    if args.preset and args.matrix is None:
        info["preset"] = preset_record(matrix, args.preset)
    return info


def _new_run(args: argparse.Namespace, api_key: str | None, client: Any) -> int:
    if not args.url:
        raise UsageError("--url is required (or --resume DIR)")
    url = base_url(args.url)
    if not args.out:
        raise UsageError("--out DIR is required")
    matrix = matrix_from_args(args)
    address, shards = ray_options(args)
    ensure_descriptors(max(matrix.concurrency or [1]))
    created = not args.out.exists()
    prepare_out(args.out, force=args.force)
    try:
        with open_pool(address, shards) as pool:
            run = sweep.Sweep(
                url,
                matrix,
                out=args.out,
                api_key=api_key,
                model=args.model,
                overrides=target_overrides(args),
                info=_report_info(args, matrix),
                progress=not args.quiet,
                report=not args.no_report,
                tokenizer=args.tokenizer,
                client=client,
                shards=pool,
            )
            run.execute()
    finally:
        # a run that could not start (server unreachable, bad tokenizer) leaves no empty
        # folder behind; one that wrote anything keeps it
        if created and args.out.is_dir() and not any(args.out.iterdir()):
            args.out.rmdir()
    return run_exit_status(runfile.read_run(args.out, strict=False))


def run_exit_status(doc: dict) -> int:
    """The exit status of a finished run (`speedmatrix.verdict.exit_status`)."""

    return int(exit_status(doc))


def prepare_out(out: Path, force: bool = False) -> Path | None:
    """Makes the --out folder. One that holds another run (a run.json) is refused unless
    ``force``, which renames the folder to ``<out>.replaced-<UTC time>`` (nothing is deleted)
    and returns that new path."""

    out = Path(out)
    moved = None
    if out.exists() and not out.is_dir():
        raise SpeedmatrixError(f"--out {out} is a file, not a folder")
    if (out / "run.json").exists():
        if not force:
            raise SpeedmatrixError(
                f"--out {out} holds another run; continue it with --resume {out}, choose "
                "another folder, or add --force to move it aside"
            )
        ensure_unlocked(out)  # a run in progress there is never moved
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        moved = out.with_name(f"{out.resolve().name}.replaced-{stamp}")
        n = 1
        while moved.exists():
            n += 1
            moved = out.with_name(f"{out.resolve().name}.replaced-{stamp}-{n}")
        try:
            out.rename(moved)
        except OSError as exc:
            raise SpeedmatrixError(
                f"--force: cannot move {out} aside to {moved} ({exc.strerror or exc})"
            ) from None
        print(f"speedmatrix: moved the previous run in {out} to {moved}", file=sys.stderr)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpeedmatrixError(f"cannot make --out {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise SpeedmatrixError(f"cannot write in --out {out}: permission denied")
    return moved


def ensure_descriptors(concurrency: int) -> None:
    """A cell of ``concurrency`` streams needs a descriptor each, plus FD_MARGIN. The soft
    limit is raised to the hard one when short; a hard limit too low is the client's limit,
    said before any cell runs (not found later as connect errors blamed on the server)."""

    need = int(concurrency) + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise SpeedmatrixError(
        f"concurrency {concurrency} needs about {need} open files, and this process may open "
        f"{hard} (the hard limit); raise it (ulimit -Hn {need} as root, or LimitNOFILE= in "
        "a systemd unit) or lower --concurrency"
    )
