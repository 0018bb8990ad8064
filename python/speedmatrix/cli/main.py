"""The command line's entry: the parser of every command, and `main` (signals, one line
per failure, exit statuses)."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

from speedmatrix.cli import parsers, run_flags
from speedmatrix.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    STOP_SIGNALS,
    Formatter,
    Parser,
    api_key_of,
    version_text,
)
from speedmatrix.cliargs import UsageError
from speedmatrix.errors import SpeedmatrixError, clip, route_warnings
from speedmatrix.redact import redact, redact_known


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command's parser (one module each), --debug on all."""
    parser = Parser(
        prog="speedmatrix",
        description="Speed test matrix for OpenAI-compatible "
        "LLM servers: prefill, sustained decode, TTFT, time between tokens.",
        formatter_class=Formatter,
        epilog="""\
start here:
  speedmatrix demo                      # the built-in engine, the seed's matrix, a report
  speedmatrix run --url URL --preset seed --out DIR --dry-run   # the plan and its time
  speedmatrix run --url URL --preset seed --out DIR             # measure your server
  speedmatrix COMMAND --help            # every option, with defaults and examples
""",
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    for add in (
        run_flags.add_parser,
        parsers.add_init,
        parsers.add_sim,
        parsers.add_demo,
        parsers.add_report,
        parsers.add_show,
        parsers.add_recompute,
        parsers.add_compare,
        parsers.add_capacity,
        parsers.add_predict,
        parsers.add_fit,
    ):
        add(sub)
    for p in sub.choices.values():  # --debug after the command too; SUPPRESS keeps the top's
        p.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show tracebacks of failures",
        )
    return parser


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """`speedmatrix NAME`: ``speedmatrix.cli.NAME.command``, imported when it runs."""

    def command(args: argparse.Namespace) -> int:
        # start-up: a command's module (numpy, pandas, the sweep) loads only when it runs
        return int(importlib.import_module(f"speedmatrix.cli.{name}").command(args))

    return command


COMMANDS = {
    name: _command(name)
    for name in (
        "run",
        "init",
        "sim",
        "demo",
        "report",
        "compare",
        "capacity",
        "recompute",
        "show",
        "predict",
        "fit",
    )
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
    text = clip(text, 2000) or "(no message)"  # speedmatrix.errors.clip: one line, bounded
    return redact_known(redact(text), secrets)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    secrets: list[str] = []
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    if not debug:  # library warnings as one line each, without package paths
        route_warnings()

    def say(text: str) -> None:
        if debug:
            sys.stderr.write(redact_known(redact(traceback.format_exc()), secrets))
        print(f"speedmatrix: error: {_one_line(text, secrets)}", file=sys.stderr)

    with _StopSignals() as stops:
        try:
            args = parser.parse_args(argv)
            if not args.command:
                parser.print_help()
                return EXIT_USAGE
            if args.command == "run":
                secrets += [s for s in (api_key_of(args),) if s]
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
