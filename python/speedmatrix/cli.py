"""The `speedmatrix` command line (the contract of DESIGN.md, plus flags).

    speedmatrix run --url URL --contexts 8k,16k --concurrency 1,2,4 --out DIR
    speedmatrix sim [--port P] [--profile NAME] [--flavour sglang|vllm] [--set KEY=VALUE]
                    [--unpaced] [--stamp] [--fault-http500 P] [--fault-malformed P]
                    [--fault-drop P] [--fault-stall P] [--seed N]
    speedmatrix demo [--out DIR]
    speedmatrix report DIR
    speedmatrix compare DIR_A DIR_B [--out DIR]

Bad flags end with one line on stderr and exit status 2 before any work
starts; a target that cannot be reached ends with one line and status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# numpy's BLAS threads spin after each call; on a machine shared with the
# server under test they would steal its cores. Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

#: where `compare` writes by default, inside DIR_B: its charts must not mix with DIR_B's own
COMPARE_DIR = "compare"
EXIT_USAGE = 2
EXIT_FAILURE = 1


class UsageError(Exception):
    """A flag or argument is wrong; the message is one line."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block on error; a user wants one line
    # that says what is wrong.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _csv(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"empty list {text!r}")
    return items


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--api-key",
        help="API key (also $SPEEDMATRIX_API_KEY / $OPENAI_API_KEY); never written anywhere",
    )
    p.add_argument("--model", help="served model name (default: the server's only/first model)")
    p.add_argument("--matrix", type=Path, help="matrix definition (TOML); flags override it")
    p.add_argument("--preset", help="start from a preset matrix: seed, quick")
    p.add_argument("--contexts", help="decode contexts, e.g. 8k,16k,32k,max")
    p.add_argument("--concurrency", help="concurrency levels, e.g. 1,2,4,8")
    p.add_argument(
        "--prefill-contexts",
        help="prefill contexts, e.g. 8k,64k,max-decode,max "
        "(max-decode: the decode max; max: the longest prompt the server takes)",
    )
    p.add_argument(
        "--duration",
        help="window per decode cell, e.g. 30s (with --precision: the longest window)",
    )
    p.add_argument(
        "--precision",
        help="end each decode window as soon as the 95%% intervals of total tok/s and of the "
        "median time between tokens are within this of their value, e.g. 2%%",
    )
    p.add_argument(
        "--min-duration",
        help="the shortest window --precision may end (default 5s)",
    )
    p.add_argument("--max-output", help="max output tokens per request, e.g. 4096")
    p.add_argument("--api", choices=["completions", "chat"], help="endpoint to measure")
    p.add_argument("--repetitions", type=int, help="repetitions of every cell")
    p.add_argument("--shared-prefix", help="tokens shared by all prompts of a cell (default 0)")
    p.add_argument("--extra-body", help="JSON object merged into every request body")
    p.add_argument("--kv-capacity", help="KV cache capacity in tokens (overrides the probe)")
    p.add_argument("--context-length", help="server context length (overrides the probe)")
    p.add_argument("--max-running", type=int, help="server running-request cap (overrides)")
    p.add_argument(
        "--launch-command",
        help="the server's launch command, for the report (secrets are redacted)",
    )
    p.add_argument("--gpu", help="GPU name for the report (default: nvidia-smi when local)")
    p.add_argument("--vram", help="GPU memory for the report, e.g. '141 GB'")
    p.add_argument("--hardware-type", help="e.g. 'Discrete GPU'")
    p.add_argument(
        "--os",
        help="the server's OS for the report (default: this machine's when the server is local)",
    )
    p.add_argument(
        "--engine",
        help="engine name: an adapter (sglang, vllm, ...) skips "
        "detection; any other name only names the engine in the report",
    )
    p.add_argument("--engine-version", help="engine version (overrides the probe)")
    p.add_argument("--engine-commit", help="engine commit (overrides the probe)")
    p.add_argument("--backend", help="engine backend for the report, e.g. cuda, rocm")
    p.add_argument("--build", help="engine build for the report, e.g. cuda-13.2")
    p.add_argument("--repository", help="engine repository, e.g. github.com/sgl-project/sglang")
    p.add_argument("--quantization", help="e.g. BF16, FP8 (overrides the probe)")
    p.add_argument(
        "--model-name",
        help="model name for the report's title (default: the last "
        "part of the model path the server reports, else the served name)",
    )
    p.add_argument("--revision", help="model revision for the report")
    p.add_argument("--out", type=Path, help="output folder (run.json, records, report)")
    p.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="continue an interrupted run in DIR without redoing finished cells",
    )
    p.add_argument("--no-report", action="store_true", help="do not write report.md/html")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="local Hugging Face tokenizer for exact prompts (needs the "
        "transformers or tokenizers package)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="speedmatrix",
        description="Speed test matrix for OpenAI-compatible "
        "LLM servers: prefill, sustained decode, TTFT, time between tokens.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="measure a server")
    _add_run_flags(run)

    sim = sub.add_parser("sim", help="run the built-in engine in the foreground")
    sim.add_argument("--port", type=int, default=8000)
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--profile", default="seed-h200")
    sim.add_argument("--flavour", choices=["sglang", "vllm"])
    sim.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile field"
    )
    from speedmatrix.sim import add_engine_flags  # standard library only: cheap to import

    add_engine_flags(sim)  # --unpaced, --stamp, --fault-* P, --seed N

    demo = sub.add_parser("demo", help="built-in engine + the seed's matrix + report")
    demo.add_argument("--out", type=Path, default=Path("speedmatrix-demo"))
    demo.add_argument(
        "--duration",
        default="3s",
        help="window per decode cell (default 3s: windows open at steady state; the seed used 30s)",
    )
    demo.add_argument("--quiet", action="store_true")

    rep = sub.add_parser("report", help="write report.md and report.html of a saved run")
    rep.add_argument("dir", type=Path)

    rec = sub.add_parser(
        "recompute",
        help="rebuild every cell of a saved run from its records (optionally with other rules)",
        description="Judges every measured cell of a saved run again from its raw records, "
        "the engine facts and the rules saved with it, and says which cells changed. "
        "Nothing is written without --write.",
    )
    rec.add_argument("dir", type=Path)
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

    cmp_ = sub.add_parser("compare", help="compare two saved runs")
    cmp_.add_argument("dir_a", type=Path)
    cmp_.add_argument("dir_b", type=Path)
    cmp_.add_argument(
        "--out",
        type=Path,
        help="folder for compare.md/html/csv and its "
        "charts (default: DIR_B/compare, apart from DIR_B's own report)",
    )
    return parser


def _version() -> str:
    from speedmatrix import __version__

    return f"speedmatrix {__version__}"


def _matrix_from_args(args: argparse.Namespace):
    from speedmatrix.matrix import Matrix, parse_contexts, parse_precision
    from speedmatrix.units import parse_duration, parse_tokens

    if args.matrix is not None:
        if not args.matrix.is_file():
            raise UsageError(f"--matrix: no such file {args.matrix}")
        m = Matrix.from_toml(args.matrix)
    elif args.preset:
        m = Matrix.preset(args.preset)
    else:
        m = Matrix()

    try:
        if args.contexts:
            m.contexts = parse_contexts(",".join(_csv(args.contexts)))
        if args.prefill_contexts:
            m.prefill_contexts = parse_contexts(",".join(_csv(args.prefill_contexts)), prefill=True)
        if args.concurrency:
            m.concurrency = [_positive_int(c, "--concurrency") for c in _csv(args.concurrency)]
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
        m.validate()
    except UsageError:
        raise
    except json.JSONDecodeError as exc:
        raise UsageError(f"--extra-body is not valid JSON: {exc.msg}") from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return m


def _positive_int(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not an integer") from None
    if value <= 0:
        raise UsageError(f"{flag}: {value} is not a positive integer")
    return value


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
        out["max_running"] = _positive_int(str(args.max_running), "--max-running")
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


def _cmd_run(args: argparse.Namespace) -> int:
    from speedmatrix import sweep

    if args.resume is not None:
        return sweep.resume(
            args.resume,
            api_key=_api_key(args),
            progress=not args.quiet,
            report=not args.no_report,
            tokenizer=args.tokenizer,
        )
    if not args.url:
        raise UsageError("--url is required (or --resume DIR)")
    if not args.out:
        raise UsageError("--out DIR is required")
    matrix = _matrix_from_args(args)
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
        api_key=_api_key(args),
        model=args.model,
        overrides=_overrides(args),
        info=info,
        progress=not args.quiet,
        report=not args.no_report,
        tokenizer=args.tokenizer,
    )
    return run.execute()


def _api_key(args: argparse.Namespace) -> str | None:
    return (
        args.api_key
        or os.environ.get("SPEEDMATRIX_API_KEY")
        or os.environ.get("OPENAI_API_KEY")
        or None
    )


def _cmd_sim(args: argparse.Namespace) -> int:
    from speedmatrix import sim

    argv = ["--port", str(args.port), "--host", args.host, "--profile", args.profile]
    if args.flavour:
        argv += ["--flavour", args.flavour]
    for kv in args.set:
        argv += ["--set", kv]
    argv += sim.engine_flag_args(args)  # sim.main takes them under the same names
    return sim.main(argv)


def _cmd_demo(args: argparse.Namespace) -> int:
    from speedmatrix import demo

    return demo.main(out=args.out, duration=args.duration, progress=not args.quiet)


def _cmd_report(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix.report import write_report

    md, html = write_report(args.dir)
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
    "sim": _cmd_sim,
    "demo": _cmd_demo,
    "report": _cmd_report,
    "compare": _cmd_compare,
    "recompute": _cmd_recompute,
}


def main(argv: list[str] | None = None) -> int:
    from speedmatrix.errors import SpeedmatrixError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return EXIT_USAGE
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"speedmatrix: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SpeedmatrixError as exc:
        print(f"speedmatrix: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:  # outside a sweep (discovery, prompt building)
        print("speedmatrix: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
