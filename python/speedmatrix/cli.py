"""The `speedmatrix` command line (the contract of DESIGN.md, plus flags).

    speedmatrix run --url URL --contexts 8k,16k --concurrency 1,2,4 --out DIR [--dry-run]
    speedmatrix init matrix.toml [--preset seed|quick]
    speedmatrix sim [--port P] [--profile NAME] [--flavour sglang|vllm] [--set KEY=VALUE]
                    [--unpaced] [--stamp] [--fault-http500 P] [--fault-malformed P]
                    [--fault-drop P] [--fault-stall P] [--seed N]
    speedmatrix demo [--out DIR]
    speedmatrix report DIR
    speedmatrix compare DIR_A DIR_B [--out DIR]
    speedmatrix capacity DIR --slo ttft=2s,tpot=50ms [--attainment 95%] [--json]

Over 500 lines: the parsers are the CLI's documentation (every option's help, groups,
epilog examples) and stay in one place so a test can walk them all.

Exit status (docs/RELIABILITY.md): 0 every runnable cell measured; 3 some cells failed
(status error) or were not run; 1 nothing was measured or the run could not start (a target
that cannot be reached, a folder that holds another run, a file that cannot be written);
2 bad flags, before any work starts; 130 / 143 / 129 interrupted by SIGINT / SIGTERM /
SIGHUP (the run is saved, marked interrupted, and the report written; a second signal exits
at once, run.json intact since every write is atomic). Every failure is one line on stderr,
redacted; --debug adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from speedmatrix.cliargs import UsageError, csv_list, positive_int
from speedmatrix.cliargs import port as port_arg

# numpy's BLAS threads spin after each call; on a machine shared with the
# server under test they would steal its cores. Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

#: where `compare` writes by default, inside DIR_B: its charts must not mix with DIR_B's own
COMPARE_DIR = "compare"
EXIT_OK = 0
#: nothing was measured, or the run could not start
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: some cells failed (status error) or were not run; the others were measured
EXIT_PARTIAL = 3
#: the signals that stop a run as Ctrl-C does; exit status 128 + the signal's number
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: descriptors a run needs beyond one per stream: discovery, /metrics, files, libcurl's own
FD_MARGIN = 64


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block on error; a user wants one line
    # that says what is wrong.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


class _Formatter(argparse.HelpFormatter):
    """Help with the epilog's examples kept as written (text with line breaks), other text
    wrapped, and every real default shown: ``(default: 30s)``; options whose default is
    "not given" (None, False) say nothing."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        if action.option_strings:
            text += " (default: %(default)s)"
        return text


#: the matrix defaults the help shows (no preset, no --matrix): written out, not read from
#: speedmatrix.matrix, so --help imports nothing heavy; a test keeps them equal to Matrix()
RUN_DEFAULTS = {
    "contexts": "8K",
    "concurrency": "1",
    "duration": "30s",
    "max_output": "4096",
    "api": "completions",
    "repetitions": "1",
}


def _defaults() -> dict[str, str]:
    return RUN_DEFAULTS


RUN_EPILOG = """\
examples:
  # measure a server: the seed's matrix, report in out/my-server/report.html
  speedmatrix run --url http://127.0.0.1:8000 --preset seed --out out/my-server

  # see the plan, what will not run, and how long it takes, without sending load
  speedmatrix run --url http://127.0.0.1:8000 --preset seed --out out/x --dry-run

  # a small matrix of your own, no prefill cells
  speedmatrix run --url http://127.0.0.1:8000 --contexts 8k,32k --concurrency 1,4,16 \\
      --prefill-contexts none --duration 20s --out out/small

  # a matrix file (speedmatrix init writes a commented one), with report metadata
  speedmatrix run --url http://127.0.0.1:8000 --matrix matrix.toml --out out/h200 \\
      --meta gpu="H200 NVL" --meta launch_command="$(cat launch.sh)"

  # continue a run that was interrupted
  speedmatrix run --resume out/h200
"""

#: --meta KEY=VALUE keys, each the same as the flag of that name (gpu = --gpu)
META_KEYS = (
    "launch_command",
    "gpu",
    "vram",
    "hardware_type",
    "os",
    "engine",
    "engine_version",
    "engine_commit",
    "backend",
    "build",
    "repository",
    "quantization",
    "model_name",
    "revision",
)


def add_run_groups(p: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """The `run` options in their groups; returns the groups by name (target, matrix, load,
    capacity, metadata, output) so another module's options join the right one:
    ``groups["load"].add_argument(...)``."""
    d = _defaults()
    groups = {
        "target": p.add_argument_group("target", "the server to measure"),
        "matrix": p.add_argument_group(
            "matrix",
            "which cells: contexts × concurrency, plus prefill contexts. Flags override "
            "--matrix/--preset; without either the defaults below apply",
        ),
        "load": p.add_argument_group("load", "what each cell sends"),
        "capacity": p.add_argument_group(
            "capacity overrides",
            "probed from the server where it tells; give them when it does not (or lies)",
        ),
        "metadata": p.add_argument_group(
            "report metadata",
            "what the report says about the setup; also as --meta KEY=VALUE",
        ),
        "output": p.add_argument_group("output", "where the run goes and what is shown"),
    }
    g = groups["target"]
    g.add_argument("--url", help="base URL of the server, e.g. http://127.0.0.1:8000")
    g.add_argument(
        "--api-key",
        help="API key (also $SPEEDMATRIX_API_KEY / $OPENAI_API_KEY); never written anywhere",
    )
    g.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help="read the API key from FILE (keeps it out of the process list and shell history)",
    )
    g.add_argument(
        "--ca-file", type=Path, metavar="PEM", help="https: verify the server against this CA"
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        help="https: do not verify the server's certificate (said in the report)",
    )
    g.add_argument("--model", help="served model name (default: the server's only/first model)")
    g.add_argument(
        "--api",
        choices=["completions", "chat"],
        help=f"endpoint to measure (default: {d['api']})",
    )
    g.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="local Hugging Face tokenizer for exact prompts (needs the "
        "transformers or tokenizers package)",
    )

    g = groups["matrix"]
    g.add_argument("--matrix", type=Path, help="matrix definition (TOML; see speedmatrix init)")
    g.add_argument("--preset", choices=["seed", "quick"], help="start from a preset matrix")
    g.add_argument(
        "--contexts",
        help=f"decode contexts, e.g. 8k,16k,32k,max (default: {d['contexts']})",
    )
    g.add_argument(
        "--concurrency",
        help=f"requests at once, e.g. 1,2,4,8 (default: {d['concurrency']})",
    )
    g.add_argument(
        "--prefill-contexts",
        help="prefill contexts, e.g. 8k,64k,max-decode,max "
        "(max-decode: the decode max; max: the longest prompt the server takes); "
        "none: no prefill cells (default: none)",
    )
    g.add_argument(
        "--repetitions",
        type=int,
        help=f"repetitions of every cell (default: {d['repetitions']})",
    )

    g = groups["load"]
    g.add_argument(
        "--duration",
        help="window per decode cell, e.g. 30s; with --precision, the longest window "
        f"(default: {d['duration']})",
    )
    g.add_argument(
        "--precision",
        help="end each decode window as soon as the 95%% intervals of total tok/s and of the "
        "median time between tokens are within this of their value, e.g. 2%% (default: off)",
    )
    g.add_argument(
        "--min-duration",
        help="the shortest window --precision may end (default: 5s)",
    )
    g.add_argument(
        "--max-output",
        help=f"max output tokens per request, e.g. 4096 (default: {d['max_output']})",
    )
    g.add_argument(
        "--shared-prefix",
        help="tokens shared by all prompts of a cell; negative: all but the last N (default: 0)",
    )
    g.add_argument(
        "--extra-body",
        metavar="JSON",
        help="JSON object merged into every request body, e.g. '{\"top_k\": 1}'",
    )

    g = groups["capacity"]
    g.add_argument("--kv-capacity", help="KV cache capacity in tokens, e.g. 1400000 or 1367k")
    g.add_argument("--context-length", help="server context length in tokens, e.g. 128k")
    g.add_argument("--max-running", type=int, help="most requests the server runs at once")

    g = groups["metadata"]
    g.add_argument(
        "--launch-command",
        help="the server's launch command, for the report (secrets are redacted)",
    )
    g.add_argument("--gpu", help="GPU name (default: nvidia-smi when the server is local)")
    g.add_argument("--vram", help="GPU memory, e.g. '141 GB'")
    g.add_argument("--hardware-type", help="e.g. 'Discrete GPU'")
    g.add_argument(
        "--os", help="the server's OS (default: this machine's when the server is local)"
    )
    g.add_argument(
        "--engine",
        help="engine name: an adapter (sglang, vllm, ...) skips "
        "detection; any other name only names the engine in the report",
    )
    g.add_argument("--engine-version", help="engine version (overrides the probe)")
    g.add_argument("--engine-commit", help="engine commit (overrides the probe)")
    g.add_argument("--backend", help="engine backend, e.g. cuda, rocm")
    g.add_argument("--build", help="engine build, e.g. cuda-13.2")
    g.add_argument("--repository", help="engine repository, e.g. github.com/sgl-project/sglang")
    g.add_argument("--quantization", help="e.g. BF16, FP8 (overrides the probe)")
    g.add_argument(
        "--model-name",
        help="model name for the report's title (default: the last "
        "part of the model path the server reports, else the served name)",
    )
    g.add_argument("--revision", help="model revision")
    g.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any of the above by key, e.g. --meta gpu='H200 NVL' (keys: "
        + ", ".join(META_KEYS)
        + "); the flag wins over --meta",
    )

    g = groups["output"]
    g.add_argument("--out", type=Path, help="output folder (run.json, records, report)")
    g.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="continue a run in DIR: measures every cell not valid, queued or over capacity "
        "(interrupted, failed, not run)",
    )
    g.add_argument(
        "--force",
        action="store_true",
        help="--out holds another run: move it aside to DIR.replaced-<time> (never deleted); "
        "with --resume: continue on a server whose settings changed (recorded in the run)",
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="probe the server (no generation requests) and print the plan, the cells that "
        "will not run and why, how prompts are made, and the estimated duration",
    )
    g.add_argument("--no-report", action="store_true", help="do not write report.md/html")
    g.add_argument("--quiet", action="store_true", help="no progress display")
    return groups


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="speedmatrix",
        description="Speed test matrix for OpenAI-compatible "
        "LLM servers: prefill, sustained decode, TTFT, time between tokens.",
        formatter_class=_Formatter,
        epilog="""\
start here:
  speedmatrix demo                      # the built-in engine, the seed's matrix, a report
  speedmatrix run --url URL --preset seed --out DIR --dry-run   # the plan and its time
  speedmatrix run --url URL --preset seed --out DIR             # measure your server
  speedmatrix COMMAND --help            # every option, with defaults and examples
""",
    )
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="measure a server",
        description="Measure a server: every cell of the matrix, saved to --out as run.json, "
        "records, cells.csv and a report.",
        epilog=RUN_EPILOG,
        formatter_class=_Formatter,
    )
    add_run_groups(run)
    from speedmatrix.cli_load import add_capacity_parser, add_open_loop_flags

    add_open_loop_flags(run)

    init = sub.add_parser(
        "init",
        help="write a commented matrix file to start from",
        description="Write a matrix definition (TOML) with every setting explained, to edit "
        "and pass to `speedmatrix run --matrix`.",
        epilog="examples:\n  speedmatrix init matrix.toml\n"
        "  speedmatrix init --preset quick small.toml\n",
        formatter_class=_Formatter,
    )
    init.add_argument("path", type=Path, help="file to write (not overwritten without --force)")
    init.add_argument(
        "--preset", choices=["seed", "quick"], default="seed", help="the matrix to start from"
    )
    init.add_argument("--force", action="store_true", help="overwrite an existing file")

    sim = sub.add_parser(
        "sim",
        help="run the built-in engine in the foreground",
        description="The built-in engine (speedmatrix-sim): an OpenAI-compatible server "
        "modelled on a real one, to try speedmatrix without a GPU.",
        epilog="examples:\n  speedmatrix sim --port 8000\n"
        "  speedmatrix sim --profile fixed --fault-http500 0.05 --seed 1\n",
        formatter_class=_Formatter,
    )
    sim.add_argument("--port", type=port_arg, default=8000, help="port to listen on")
    sim.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sim.add_argument(
        "--profile",
        default="seed-h200",
        help="engine profile: a shipped name (seed-h200, fixed, ...) or a .json path",
    )
    sim.add_argument(
        "--flavour",
        choices=["sglang", "vllm"],
        help="which engine's endpoints and metrics to imitate (default: the profile's)",
    )
    sim.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile field"
    )
    from speedmatrix.sim import add_engine_flags  # standard library only: cheap to import

    add_engine_flags(sim)  # --unpaced, --stamp, --fault-* P, --seed N

    demo = sub.add_parser(
        "demo",
        help="built-in engine + the seed's matrix + report",
        description="Start the built-in engine, run the seed's matrix against it, and write "
        "the report: what a run looks like, in a few minutes, without a GPU.",
        epilog="examples:\n  speedmatrix demo\n  speedmatrix demo --out /tmp/demo --duration 2s\n",
        formatter_class=_Formatter,
    )
    demo.add_argument(
        "--out", type=Path, default=Path("speedmatrix-demo"), help="output folder of the run"
    )
    demo.add_argument(
        "--duration",
        default="3s",
        help="window per decode cell (windows open at steady state; the seed used 30s)",
    )
    demo.add_argument("--quiet", action="store_true", help="no progress display")

    rep = sub.add_parser(
        "report",
        help="write report.md and report.html of a saved run",
        description="(Re)write DIR/report.md, DIR/report.html and DIR/plots/ from DIR/run.json "
        "and the saved records; run.json is checked against its schema first.",
        epilog="examples:\n  speedmatrix report out/h200\n"
        "  speedmatrix report out/h200 --slo ttft=2s,tpot=50ms --attainment 99%\n",
        formatter_class=_Formatter,
    )
    rep.add_argument("dir", type=Path, help="folder of a saved run (holds run.json)")
    rep.add_argument(
        "--slo",
        metavar="TARGETS",
        help="judge the goodput grid and capacity answer against these targets (any of ttft, "
        "tpot, e2e, tbt) instead of the run's own --slo, e.g. ttft=2s,tpot=50ms",
    )
    rep.add_argument(
        "--attainment",
        metavar="SHARE",
        help="share of requests that must meet the SLO (default: the run's, else 95%%)",
    )

    rec = sub.add_parser(
        "recompute",
        help="rebuild every cell of a saved run from its records (optionally with other rules)",
        description="Judges every measured cell of a saved run again from its raw records, "
        "the engine facts and the rules saved with it, and says which cells changed. "
        "Nothing is written without --write.",
        epilog="examples:\n  speedmatrix recompute out/h200\n"
        "  speedmatrix recompute out/h200 --rule error_threshold=0.1 --write\n",
        formatter_class=_Formatter,
    )
    rec.add_argument("dir", type=Path, help="folder of a saved run (holds run.json and records/)")
    rec.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change a threshold (e.g. error_threshold=0.1, queue_gap_requests=1); repeatable",
    )
    rec.add_argument(
        "--write", action="store_true", help="rewrite DIR/run.json with the recomputed cells"
    )

    cmp_ = sub.add_parser(
        "compare",
        help="compare two saved runs",
        description="Compare two saved runs cell by cell (B against A): a cell differs where "
        "the 95% intervals do not overlap, else by Welch's test on per-second throughput.",
        epilog="examples:\n  speedmatrix compare out/before out/after\n",
        formatter_class=_Formatter,
    )
    cmp_.add_argument("dir_a", type=Path, help="the baseline run (A)")
    cmp_.add_argument("dir_b", type=Path, help="the run compared with it (B)")
    cmp_.add_argument(
        "--out",
        type=Path,
        help="folder for compare.md/html/csv and its "
        "charts (default: DIR_B/compare, apart from DIR_B's own report)",
    )
    add_capacity_parser(sub, _Formatter)
    for p in sub.choices.values():  # --debug after the command too; SUPPRESS keeps the top's
        p.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show tracebacks of failures",
        )
    return parser


def _version() -> str:
    from speedmatrix import __version__

    return f"speedmatrix {__version__}"


def _matrix_from_args(args: argparse.Namespace):
    from speedmatrix.matrix import Matrix, parse_contexts, parse_precision
    from speedmatrix.units import parse_duration, parse_tokens

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
        from speedmatrix.cli_load import apply_open_loop_flags

        apply_open_loop_flags(m, args)
        m.validate()
    except UsageError:
        raise
    except json.JSONDecodeError as exc:
        raise UsageError(f"--extra-body is not valid JSON: {exc.msg}") from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return m


def _overrides(args: argparse.Namespace) -> dict:
    from speedmatrix.units import parse_tokens

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


def _apply_meta(args: argparse.Namespace) -> None:
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


def _cmd_run(args: argparse.Namespace) -> int:
    from speedmatrix import http, runfile, sweep

    _apply_meta(args)
    api_key = _api_key(args)
    if args.ca_file is not None and not args.ca_file.is_file():
        raise UsageError(f"--ca-file: no such file {args.ca_file}")
    client = http.ClientConfig.make(args.url, api_key, ca_file=args.ca_file, insecure=args.insecure)
    if args.dry_run:
        if args.resume is not None:
            raise UsageError("--dry-run plans a new run; it does not take --resume")
        if not args.url:
            raise UsageError("--url is required")
        from speedmatrix import dryrun

        print(
            dryrun.describe(
                args.url,
                _matrix_from_args(args),
                api_key=api_key,
                model=args.model,
                overrides=_overrides(args),
                tokenizer=args.tokenizer,
                client=client,
            )
        )
        return 0
    if args.resume is not None:
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
        )
        return run_exit_status(runfile.read_run(args.resume, strict=False))
    if not args.url:
        raise UsageError("--url is required (or --resume DIR)")
    if not args.url.lower().startswith(("http://", "https://")):
        raise UsageError(f"--url must start with http:// or https://, not {args.url!r}")
    if not args.out:
        raise UsageError("--out DIR is required")
    matrix = _matrix_from_args(args)
    ensure_descriptors(max(matrix.concurrency or [1]))
    created = not args.out.exists()
    prepare_out(args.out, force=args.force)
    info = {
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
    run = sweep.Sweep(
        args.url,
        matrix,
        out=args.out,
        api_key=api_key,
        model=args.model,
        overrides=_overrides(args),
        info=info,
        progress=not args.quiet,
        report=not args.no_report,
        tokenizer=args.tokenizer,
        client=client,
    )
    try:
        run.execute()
    finally:
        # a run that could not start (server unreachable, bad tokenizer) leaves no empty
        # folder behind; one that wrote anything keeps it
        if created and args.out.is_dir() and not any(args.out.iterdir()):
            args.out.rmdir()
    return run_exit_status(runfile.read_run(args.out, strict=False))


def run_exit_status(doc: dict) -> int:
    """The exit status of a finished (not interrupted) run, from its saved cells: 0 when
    every runnable cell was measured (valid or queued), EXIT_PARTIAL when some failed or
    were not run, or when a decode context could not be run at any concurrency (every
    cell of it over capacity: the server cannot serve that context at all, so what was
    asked was not measured), EXIT_FAILURE when none was measured. Over-capacity cells
    beside measured ones of their context are the matrix's edge, not a failure."""
    all_cells = doc.get("cells") or []
    cells = [c for c in all_cells if c.get("status") != "over_capacity"]
    measured = [c for c in cells if c.get("status") in ("valid", "queued") and not c.get("not_run")]
    if not measured:
        return EXIT_FAILURE
    by_context: dict[object, list[str]] = {}
    for c in all_cells:
        if c.get("phase") == "decode" and c.get("context") is not None:
            by_context.setdefault(c.get("context"), []).append(str(c.get("status")))
    refused = [k for k, st in by_context.items() if all(s == "over_capacity" for s in st)]
    return EXIT_OK if len(measured) == len(cells) and not refused else EXIT_PARTIAL


def prepare_out(out: Path, force: bool = False) -> Path | None:
    """Makes the --out folder. One that holds another run (a run.json) is refused unless
    ``force``, which renames the folder to ``<out>.replaced-<UTC time>`` (nothing is deleted)
    and returns that new path."""
    from datetime import datetime, timezone

    from speedmatrix.errors import SpeedmatrixError
    from speedmatrix.runfile import ensure_unlocked

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
    import resource

    from speedmatrix.errors import SpeedmatrixError

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


def _api_key(args: argparse.Namespace) -> str | None:
    if getattr(args, "api_key_file", None) is not None:
        from speedmatrix.errors import SpeedmatrixError

        try:
            key = args.api_key_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise SpeedmatrixError(f"--api-key-file {args.api_key_file}: {why}") from None
        if not key or "\n" in key:
            raise SpeedmatrixError(
                f"--api-key-file {args.api_key_file}: expected the key alone on one line"
            )
        return key
    return (
        args.api_key
        or os.environ.get("SPEEDMATRIX_API_KEY")
        or os.environ.get("OPENAI_API_KEY")
        or None
    )


def _cmd_init(args: argparse.Namespace) -> int:
    from speedmatrix import dryrun

    if args.path.exists() and not args.force:
        raise UsageError(f"{args.path} exists (--force overwrites it)")
    # a plain write: a config file the user edits, with the umask's usual mode
    args.path.write_text(dryrun.commented_toml(args.preset), encoding="utf-8")
    print(f"wrote {args.path}: edit it, then speedmatrix run --url URL --matrix {args.path}")
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from speedmatrix import sim

    argv = ["--port", str(args.port), "--host", args.host, "--profile", args.profile]
    if args.flavour:
        argv += ["--flavour", args.flavour]
    for kv in args.set:
        argv += ["--set", kv]
    try:
        argv += sim.engine_flag_args(args)  # sim.main takes them under the same names
    except sim.SimError as exc:  # fault shares that add up to more than 1
        raise UsageError(str(exc)) from None
    if args.api_key:
        argv += ["--api-key", args.api_key]
    return sim.main(argv)


def _cmd_demo(args: argparse.Namespace) -> int:
    from speedmatrix import demo

    return demo.main(out=args.out, duration=args.duration, progress=not args.quiet)


def _cmd_report(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix.errors import SpeedmatrixError
    from speedmatrix.report import write_report
    from speedmatrix.runfile import RunFileError, run_lock
    from speedmatrix.slo import parse_attainment, parse_slo

    try:  # a malformed --slo or --attainment is a usage error before any work
        slo = parse_slo(args.slo) if args.slo else None
        attainment = parse_attainment(args.attainment) if args.attainment else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        with run_lock(args.dir, "report"):  # never beside a run or recompute writing it
            md, html = write_report(args.dir, slo=slo, attainment=attainment)
    except RunFileError as exc:  # not valid JSON, a missing field: one line, status 1
        raise SpeedmatrixError(str(exc)) from None
    print(f"wrote {md}\nwrote {html}")
    return 0


def _cmd_recompute(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix.recompute import recompute_doc
    from speedmatrix.runfile import read_run, write_run

    changes: dict[str, float] = {}
    for item in args.rule:
        name, eq, value = item.partition("=")
        try:
            changes[name.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--rule {item!r}: expected NAME=NUMBER") from None
        if not eq:
            raise UsageError(f"--rule {item!r}: expected NAME=NUMBER")
    doc = read_run(args.dir)
    try:
        out = recompute_doc(doc, args.dir, changes=changes or None)
    except KeyError as exc:
        raise UsageError(f"--rule: {exc.args[0]}") from None
    for note in out.notes:
        print(f"note: {note}")
    old = {c.get("id"): c for c in doc.get("cells") or []}
    for cid in out.changed:
        new = next(c for c in out.doc["cells"] if c.get("id") == cid)
        was = old.get(cid) or {}
        what = []
        if was.get("status") != new.get("status"):
            what.append(f"status {was.get('status')} -> {new.get('status')}")
        gained = sorted(set(new.get("flags") or []) - set(was.get("flags") or []))
        lost = sorted(set(was.get("flags") or []) - set(new.get("flags") or []))
        what += [f"+{f}" for f in gained] + [f"-{f}" for f in lost]
        print(f"{cid}: {', '.join(what) or 'figures changed'}")
    cells = len(out.doc.get("cells") or [])
    print(f"{len(out.changed)} of {cells} cells changed")
    if args.write:
        path = write_run(args.dir, out.doc)
        print(f"wrote {path}")
    return 0


def _cmd_capacity(args: argparse.Namespace) -> int:
    from speedmatrix.cli_load import cmd_capacity

    return cmd_capacity(args)


def _cmd_compare(args: argparse.Namespace) -> int:
    for d in (args.dir_a, args.dir_b):
        if not (d / "run.json").is_file():
            raise UsageError(f"{d} holds no run.json")
    from speedmatrix.report.compare import write_compare

    paths = write_compare(args.dir_a, args.dir_b, args.out or args.dir_b / COMPARE_DIR)
    for p in paths:
        print(f"wrote {p}")
    return 0


COMMANDS = {
    "run": _cmd_run,
    "init": _cmd_init,
    "sim": _cmd_sim,
    "demo": _cmd_demo,
    "report": _cmd_report,
    "compare": _cmd_compare,
    "capacity": _cmd_capacity,
    "recompute": _cmd_recompute,
}


class _StopSignals:
    """SIGTERM and SIGHUP stop a run as SIGINT does (KeyboardInterrupt: in-flight requests
    cancelled, run.json marked interrupted, report written); a second signal of any of the
    three exits at once. run.json is only ever replaced atomically, so it stays whole."""

    def __init__(self) -> None:
        self.first: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> _StopSignals:  # noqa: PYI034 - not subclassed
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.first is not None:
            return  # stopping: a second signal while the process winds down still exits now
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: object) -> None:
        if self.first is not None:
            os.write(2, b"speedmatrix: second signal; exiting now\n")
            os._exit(128 + signum)
        self.first = signum
        raise KeyboardInterrupt

    def status(self) -> int:
        return 128 + (self.first or signal.SIGINT)


def _exit_now(status: int) -> None:
    """Ends a process stopped by a signal once its run is saved: interpreter teardown would
    put the default handlers back, and a second signal in that window would kill it with
    no status of ours. Everything is on disk already (atomic writes)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _one_line(text: str, secrets: list[str]) -> str:
    from speedmatrix.errors import clip
    from speedmatrix.redact import redact, redact_known

    text = clip(text, 2000) or "(no message)"  # speedmatrix.errors.clip: one line, bounded
    return redact_known(redact(text), secrets)


def main(argv: list[str] | None = None) -> int:
    import traceback

    from speedmatrix.errors import SpeedmatrixError, route_warnings

    parser = build_parser()
    secrets: list[str] = []
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    if not debug:  # library warnings as one line each, without package paths
        route_warnings()

    def say(text: str) -> None:
        if debug:
            from speedmatrix.redact import redact, redact_known

            sys.stderr.write(redact_known(redact(traceback.format_exc()), secrets))
        print(f"speedmatrix: error: {_one_line(text, secrets)}", file=sys.stderr)

    with _StopSignals() as stops:
        try:
            args = parser.parse_args(argv)
            if not args.command:
                parser.print_help()
                return EXIT_USAGE
            if args.command == "run":
                secrets += [s for s in (_api_key(args),) if s]
            elif getattr(args, "api_key", None):
                secrets.append(args.api_key)
            code = COMMANDS[args.command](args)
            if stops.first is not None:
                # `sim` runs until a signal: that is its normal end, and its status says how
                # its engine ended (0: stopped cleanly)
                _exit_now(code if args.command == "sim" else stops.status())
            return code
        except UsageError as exc:
            say(str(exc))
            return EXIT_USAGE
        except SpeedmatrixError as exc:
            say(str(exc))
            return EXIT_FAILURE
        except KeyboardInterrupt:  # outside a sweep (discovery, prompt building)
            print("speedmatrix: interrupted", file=sys.stderr)
            if stops.first is not None:
                _exit_now(stops.status())
            return stops.status()
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            say(f"{exc.strerror or exc}{where}")
            return EXIT_FAILURE
        except Exception as exc:  # noqa: BLE001 - a bug still gets one line, not a traceback
            say(
                f"internal error: {type(exc).__name__}: {exc} "
                "(run again with --debug for the traceback, and please report it)"
            )
            return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
