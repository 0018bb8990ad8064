"""The command line's open-loop load and SLO flags of ``run``, and the ``capacity`` command
(kept apart from cli.py, which holds the other commands)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from speedmatrix.cliargs import UsageError, csv_list, positive_int


def add_open_loop_flags(p: argparse.ArgumentParser) -> None:
    load = p.add_argument_group(
        "load (open loop)",
        "requests arrive on a schedule whatever the server does (docs/metrics.md)",
    )
    load.add_argument(
        "--request-rate",
        metavar="RATES",
        help="arrival rates in requests/s, e.g. 0.5,1,2,4: the decode cells become contexts "
        "x rates (instead of x concurrency)",
    )
    load.add_argument(
        "--arrival",
        metavar="KIND",
        help="poisson (default), constant, or gamma:SHAPE (burstiness; 1 = Poisson, < 1 burstier)",
    )
    load.add_argument(
        "--max-concurrency",
        metavar="N",
        help="at most N requests in flight; the others wait at the client (that wait counts "
        "in latency from the scheduled time)",
    )
    load.add_argument(
        "--drain-timeout",
        metavar="DURATION",
        help="how long the window's requests may take to finish after it (default 60s)",
    )
    load.add_argument(
        "--prompts",
        metavar="FILE",
        help="send a workload file's requests instead of synthetic prompts: JSONL "
        '({"prompt"|"messages", "max_tokens"}) or ShareGPT JSON; each keeps its own output '
        "length, and the context is only the row's label",
    )
    slo = p.add_argument_group("SLO", "latency targets, attainment and goodput per cell")
    slo.add_argument(
        "--percentiles",
        metavar="LIST",
        help="latency percentiles to report (default 50,90,95,99,99.9)",
    )
    slo.add_argument(
        "--slo",
        metavar="TARGETS",
        help="per-request targets, any of ttft, tpot, e2e, tbt: e.g. ttft=2s,tpot=50ms,e2e=60s",
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


def apply_open_loop_flags(m, args: argparse.Namespace) -> None:
    """The open-loop and SLO flags onto matrix ``m`` (ValueError names the flag)."""
    from speedmatrix.latency import parse_percentiles
    from speedmatrix.matrix import parse_arrival
    from speedmatrix.slo import parse_attainment, parse_slo
    from speedmatrix.units import parse_duration

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
        from speedmatrix.workload import load_prompts

        load_prompts(args.prompts)  # a bad file is one line now, before any work
        m.prompts_file = str(Path(args.prompts).resolve())


def add_capacity_parser(sub, formatter_class=argparse.HelpFormatter) -> None:
    """``speedmatrix capacity DIR --slo ... [--attainment 95%] [--json]``."""
    cap = sub.add_parser(
        "capacity",
        help="per context, the largest measured load meeting an SLO (judged from the records)",
        description="Per context: the largest measured concurrency (or request rate) whose "
        "requests meet every SLO target at the given attainment, the first that does not, "
        "and an interpolated estimate between them, judged from the saved records.",
        epilog="examples:\n  speedmatrix capacity results/h200 --slo ttft=2s,tpot=50ms\n"
        "  speedmatrix capacity results/h200 --slo e2e=60s --attainment 99% --json\n",
        formatter_class=formatter_class,
    )
    cap.add_argument("dir", type=Path, help="a saved run (the folder holding run.json)")
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


def cmd_capacity(args: argparse.Namespace) -> int:
    if not (args.dir / "run.json").is_file():
        raise UsageError(f"{args.dir} holds no run.json")
    from speedmatrix import slo
    from speedmatrix.results import load

    try:
        targets = slo.parse_slo(args.slo)
        share = slo.parse_attainment(args.attainment)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    run = load(args.dir, strict=False)
    caps = run.capacity(targets, share)
    if args.json:
        print(json.dumps({str(k): v for k, v in caps.items()}, indent=2))
    elif not caps:
        print("no measured decode cells with records in this run")
    else:
        print(slo.capacity_table(caps, targets, share), end="")
    return 0
