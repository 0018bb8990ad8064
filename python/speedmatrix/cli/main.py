"""The command line's entry: the parser of every command, and `main` (signals, one line
per failure, exit statuses)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from speedmatrix.cli import capacity, compare, demo, init, recompute, report, run, run_flags, show
from speedmatrix.cli import predict as predict_cmd
from speedmatrix.cli import selftest as selftest_cmd
from speedmatrix.cli import sim as sim_cmd
from speedmatrix.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    STOP_SIGNALS,
    Formatter,
    Parser,
    version_text,
)
from speedmatrix.cli.run import api_key_of
from speedmatrix.cliargs import UsageError


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
    for module in (
        run_flags,
        init,
        sim_cmd,
        demo,
        report,
        show,
        recompute,
        compare,
        capacity,
        predict_cmd,
        selftest_cmd,
    ):
        module.add_parser(sub)
    for p in sub.choices.values():  # --debug after the command too; SUPPRESS keeps the top's
        p.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show tracebacks of failures",
        )
    return parser


COMMANDS = {
    "run": run.command,
    "init": init.command,
    "sim": sim_cmd.command,
    "demo": demo.command,
    "report": report.command,
    "compare": compare.command,
    "capacity": capacity.command,
    "recompute": recompute.command,
    "show": show.command,
    "predict": predict_cmd.command,
    "selftest": selftest_cmd.command,
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
