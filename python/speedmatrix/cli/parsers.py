"""The parsers of the commands other than `run` (whose flags are in run_flags), one
``add_<command>(sub)`` each. Light imports only (no numpy), so that ``speedmatrix --help`` imports
nothing heavy: the commands themselves (``cli/<command>.py``) load when they run."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedmatrix.cli.common import command
from speedmatrix.cliargs import port as port_arg
from speedmatrix.sim import add_engine_flags


def run_dir(text: str) -> Path:
    """A saved run's folder (one holding run.json), checked as the flags are read: a wrong
    path is one line, before the command's heavy modules load."""
    path = Path(text)
    if not (path / "run.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} holds no run.json")
    return path


#: where `compare` writes by default, inside DIR_B: its charts must not mix with DIR_B's own
COMPARE_DIR = "compare"


def add_init(sub: argparse._SubParsersAction) -> None:
    """The `init` command."""
    init = command(
        sub,
        "init",
        "write a commented matrix file to start from",
        "Write a matrix definition (TOML) with every setting explained, to edit and pass to "
        "`speedmatrix run --matrix`.",
        "speedmatrix init matrix.toml",
        "speedmatrix init --preset quick small.toml",
    )
    init.add_argument("path", type=Path, help="file to write (not overwritten without --force)")
    init.add_argument(
        "--preset", choices=["seed", "quick"], default="seed", help="the matrix to start from"
    )
    init.add_argument("--force", action="store_true", help="overwrite an existing file")


def add_sim(sub: argparse._SubParsersAction) -> None:
    """The `sim` command."""
    sim = command(
        sub,
        "sim",
        "run the built-in engine in the foreground",
        "The built-in engine (speedmatrix-sim): an OpenAI-compatible server modelled on a real "
        "one, to try speedmatrix without a GPU.",
        "speedmatrix sim --port 8000",
        "speedmatrix sim --profile fixed --fault-http500 0.05 --seed 1",
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
    add_engine_flags(sim)  # --unpaced, --stamp, --fault-* P, --seed N


def add_demo(sub: argparse._SubParsersAction) -> None:
    """The `demo` command."""
    demo = command(
        sub,
        "demo",
        "built-in engine + the seed's matrix + report",
        "Start the built-in engine, run the seed's matrix against it, and write the report: what a"
        " run looks like, in a few minutes, without a GPU.",
        "speedmatrix demo",
        "speedmatrix demo --out /tmp/demo --duration 2s",
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


def add_report(sub: argparse._SubParsersAction) -> None:
    """The `report` command."""
    rep = command(
        sub,
        "report",
        "write report.md and report.html of a saved run",
        "(Re)write DIR/report.md, DIR/report.html and DIR/plots/ from DIR/run.json and the saved "
        "records; run.json is checked against its schema first.",
        "speedmatrix report out/h200",
        "speedmatrix report out/h200 --slo ttft=2s,tpot=50ms --attainment 99%",
    )
    rep.add_argument("dir", type=run_dir, help="folder of a saved run (holds run.json)")
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


def add_show(sub: argparse._SubParsersAction) -> None:
    """The `show` command."""
    show = command(
        sub,
        "show",
        "print a saved run's grid in the terminal",
        "Print DIR's headline grid: total tok/s by context × concurrency (or request rate), with "
        "the status of every cell that has no figure, as the report's Sustained decode table.",
        "speedmatrix show out/h200",
    )
    show.add_argument("dir", type=run_dir, help="folder of a saved run (holds run.json)")


def add_recompute(sub: argparse._SubParsersAction) -> None:
    """The `recompute` command."""
    rec = command(
        sub,
        "recompute",
        "rebuild every cell of a saved run from its records (optionally with other rules)",
        "Judges every measured cell of a saved run again from its raw records, the engine facts "
        "and the rules saved with it, and says which cells changed. Nothing is written without "
        "--write.",
        "speedmatrix recompute out/h200",
        "speedmatrix recompute out/h200 --rule error_threshold=0.1 --write",
    )
    rec.add_argument(
        "dir", type=run_dir, help="folder of a saved run (holds run.json and records/)"
    )
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


def add_compare(sub: argparse._SubParsersAction) -> None:
    """The `compare` command."""
    cmp_ = command(
        sub,
        "compare",
        "compare two saved runs",
        "Compare two saved runs cell by cell (B against A): a cell differs where the 95% intervals"
        " do not overlap, else by Welch's test on per-second throughput.",
        "speedmatrix compare out/before out/after",
    )
    cmp_.add_argument("dir_a", type=run_dir, help="the baseline run (A)")
    cmp_.add_argument("dir_b", type=run_dir, help="the run compared with it (B)")
    cmp_.add_argument(
        "--out",
        type=Path,
        help="folder for compare.md/html/csv and its "
        "charts (default: DIR_B/compare, apart from DIR_B's own report)",
    )


def add_capacity(sub: argparse._SubParsersAction) -> None:
    """``speedmatrix capacity DIR --slo ... [--attainment 95%] [--json]``."""
    cap = command(
        sub,
        "capacity",
        "per context, the largest measured load meeting an SLO (judged from the records)",
        "Per context: the largest measured concurrency (or request rate) whose requests meet every"
        " SLO target at the given attainment, the first that does not, and an interpolated "
        "estimate between them, judged from the saved records.",
        "speedmatrix capacity results/h200 --slo ttft=2s,tpot=50ms",
        "speedmatrix capacity results/h200 --slo e2e=60s --attainment 99% --json",
    )
    cap.add_argument("dir", type=run_dir, help="a saved run (the folder holding run.json)")
    cap.add_argument(
        "--slo",
        required=True,
        metavar="TARGETS",
        help="per-request targets, any of ttft, tpot, e2e, tbt: e.g. ttft=2s,tpot=50ms",
    )
    cap.add_argument(
        "--attainment",
        default="95%",
        metavar="SHARE",
        help="share of requests that must meet the SLO (default 95%%)",
    )
    cap.add_argument("--json", action="store_true", help="print the answer as JSON")


def add_predict(sub: argparse._SubParsersAction) -> None:
    """The `predict` command."""
    p = command(
        sub,
        "predict",
        "predict a decode matrix from an engine profile (no load sent)",
        "Evaluates the built-in engine's model for every (context, concurrency) decode cell of a "
        "profile (shipped, or fitted by `speedmatrix fit`); every figure is predicted, never "
        "measured, with its interval (docs/metrics.md, Predicted cells).",
        "speedmatrix predict seed-h200 --contexts 8K,64K --concurrency 1,16,64 --set kv_tokens=2x",
        "speedmatrix predict h200.json --contexts 8K,max --concurrency 1,64 --out out/pred",
    )
    p.add_argument("profile", help="a shipped profile name or a .json path")
    p.add_argument("--contexts", required=True, help="context lengths, e.g. 8K,16K,max")
    p.add_argument("--concurrency", required=True, help="concurrency levels, e.g. 1,2,4")
    p.add_argument(
        "--max-output",
        type=int,
        default=None,
        help="tokens each request may make (default: the fitted run's, else 4096)",
    )
    p.add_argument(
        "--window",
        type=float,
        default=None,
        help="window seconds (default: the fitted run's, else 30)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="what-if: VALUE or Nx"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per cell")
    p.add_argument(
        "--out", type=Path, help="also write a run folder (run.json) of the predicted cells"
    )


def add_fit(sub: argparse._SubParsersAction) -> None:
    """The `fit` command."""
    p = command(
        sub,
        "fit",
        "fit the built-in engine's profile to a measured run (for sim and predict)",
        "Fits the decode step (from the arrival gaps at each batch and context), the cold prefill "
        "(from warm-ups that ran alone) and the KV pool and limits (from discovery) to a saved "
        "run's raw records. The profile loads in `speedmatrix sim --profile` and `speedmatrix "
        "predict`; its `fit` section holds each parameter's standard deviation and the residuals "
        "(docs/metrics.md, Predicted cells).",
        "speedmatrix fit out/h200 -o h200.json",
        "speedmatrix predict h200.json --contexts 8K,64K --concurrency 1,64 --out out/pred",
    )
    p.add_argument("dir", type=Path, help="folder of a saved run (holds run.json and records/)")
    p.add_argument("-o", "--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument(
        "--base", help="a profile whose other fields (chunk budget, ...) the fitted one keeps"
    )


def add_selftest(sub: argparse._SubParsersAction) -> None:
    """The `selftest` command."""
    p = command(
        sub,
        "selftest",
        "the client's own limits on this host (requests/s, events/s, delay)",
        "Measure what the client can take in on this machine, for 1..N event loops, against the "
        "built-in engine: requests/s and SSE events/s unpaced, and the p99 delay from the engine's"
        " send to the client's read with streams in lockstep. The result is kept per host and "
        "copied into run.json by every run; a cell whose load needs more than half of it is "
        "flagged client_near_limit (docs/SCALE.md).",
        "speedmatrix selftest",
        "speedmatrix selftest --loops 1,2 --duration 3 --json",
    )
    p.add_argument(
        "--loops",
        metavar="N,N",
        help="loop counts to measure (default: 1, 2, 4, ... up to the cores minus one)",
    )
    p.add_argument("--duration", type=float, default=2.0, help="window per cell, s")
    p.add_argument(
        "--streams", type=int, default=512, help="streams of the lockstep cell (default 512)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-save", action="store_true", help="do not keep it for later runs")
