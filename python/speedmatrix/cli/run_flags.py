"""The `run` command's parser: its argument groups (target, matrix, load, capacity,
metadata, output; and the open-loop and SLO groups), with the defaults the
help shows and the flags that set a matrix field."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import Formatter, value_flags
from speedmatrix.cli.ray_flags import add_ray_flags
from speedmatrix.cli.sparse_flags import SPARSE_FLAGS, add_sparse_flags
from speedmatrix.cli.traffic_flags import TRAFFIC_FLAGS, add_traffic_flags

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


#: the run flags that set a matrix field: (argparse attribute, field, the flag as typed)
MATRIX_FLAGS = (
    ("contexts", "contexts", "--contexts"),
    ("concurrency", "concurrency", "--concurrency"),
    ("prefill_contexts", "prefill_contexts", "--prefill-contexts"),
    ("repetitions", "repetitions", "--repetitions"),
    ("duration", "duration_s", "--duration"),
    ("precision", "precision", "--precision"),
    ("min_duration", "min_duration_s", "--min-duration"),
    ("max_output", "max_output", "--max-output"),
    ("shared_prefix", "shared_prefix", "--shared-prefix"),
    ("extra_body", "extra", "--extra-body"),
    ("api", "api", "--api"),
    ("request_rate", "request_rates", "--request-rate"),
    ("arrival", "arrival", "--arrival"),
    ("max_concurrency", "max_concurrency", "--max-concurrency"),
    ("drain_timeout", "drain_timeout_s", "--drain-timeout"),
    ("prompts", "prompts_file", "--prompts"),
    ("percentiles", "percentiles", "--percentiles"),
    ("slo", "slo", "--slo"),
    ("attainment", "attainment", "--attainment"),
    ("search", "search", "--search"),
    ("client_threads", "client_threads", "--client-threads"),
    *TRAFFIC_FLAGS,
    *SPARSE_FLAGS,
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
    _target_flags(groups["target"], d)
    _matrix_flags(groups["matrix"], d)
    _load_flags(groups["load"], d)
    _capacity_flags(groups["capacity"])
    _metadata_flags(groups["metadata"])
    _output_flags(groups["output"])
    return groups


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `run` command and its argument groups."""
    run = sub.add_parser(
        "run",
        help="measure a server",
        description="Measure a server: every cell of the matrix, saved to --out as run.json, "
        "records, cells.csv and a report.",
        epilog=RUN_EPILOG,
        formatter_class=Formatter,
    )
    add_run_groups(run)
    add_open_loop_flags(run)
    add_traffic_flags(run)
    add_sparse_flags(run)
    add_ray_flags(run)


def _target_flags(g: argparse._ArgumentGroup, d: dict[str, str]) -> None:
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


def _matrix_flags(g: argparse._ArgumentGroup, d: dict[str, str]) -> None:
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


def _load_flags(g: argparse._ArgumentGroup, d: dict[str, str]) -> None:
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
    value_flags(
        g,
        (
            "--extra-body",
            "JSON",
            "JSON object merged into every request body, e.g. '{\"top_k\": 1}'",
        ),
        (
            "--client-threads",
            "N|auto",
            (
                "the client's event loops per cell, each on its own core (default: auto, one per "
                "256 streams, at most the cores minus one; see speedmatrix selftest)"
            ),
        ),
    )


def _capacity_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--kv-capacity", help="KV cache capacity in tokens, e.g. 1400000 or 1367k")
    g.add_argument("--context-length", help="server context length in tokens, e.g. 128k")
    g.add_argument("--max-running", type=int, help="most requests the server runs at once")


def _metadata_flags(g: argparse._ArgumentGroup) -> None:
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


def _output_flags(g: argparse._ArgumentGroup) -> None:
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


def add_open_loop_flags(p: argparse.ArgumentParser) -> None:
    load = p.add_argument_group(
        "load (open loop)",
        "requests arrive on a schedule whatever the server does (docs/metrics.md)",
    )
    value_flags(
        load,
        (
            "--request-rate",
            "RATES",
            (
                "arrival rates in requests/s, e.g. 0.5,1,2,4: the decode cells become contexts x "
                "rates (instead of x concurrency)"
            ),
        ),
        (
            "--arrival",
            "KIND",
            "poisson (default), constant, or gamma:SHAPE (burstiness; 1 = Poisson, < 1 burstier)",
        ),
        (
            "--max-concurrency",
            "N",
            (
                "at most N requests in flight; the others wait at the client (that wait counts in "
                "latency from the scheduled time)"
            ),
        ),
        (
            "--drain-timeout",
            "DURATION",
            "how long the window's requests may take to finish after it (default 60s)",
        ),
        (
            "--prompts",
            "FILE",
            (
                "send a workload file's requests instead of synthetic prompts: JSONL "
                '({"prompt"|"messages", "max_tokens"}) or ShareGPT JSON; each keeps its own output '
                "length, and the context is only the row's label"
            ),
        ),
    )
    slo = p.add_argument_group("SLO", "latency targets, attainment and goodput per cell")
    value_flags(
        slo,
        (
            "--percentiles",
            "LIST",
            "latency percentiles to report (default 50,90,95,99,99.9)",
        ),
        (
            "--slo",
            "TARGETS",
            "per-request targets, any of ttft, tpot, e2e, tbt: e.g. ttft=2s,tpot=50ms,e2e=60s",
        ),
    )
    slo.add_argument(
        "--search",
        choices=["concurrency", "rate"],
        help="instead of the grid, find per context the largest concurrency (from the first "
        "--concurrency) or rate (from the first --request-rate) meeting --slo: bracket and "
        "bisect, at most 8 cells per context, until within 10%%",
    )
    slo.add_argument(
        "--attainment",
        metavar="SHARE",
        help="share of requests that must meet the SLO for a load to pass (default 95%%)",
    )
