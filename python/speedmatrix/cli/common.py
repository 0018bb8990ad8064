"""What every command of the command line shares: exit statuses, the one-line parser
error, the help formatter."""

from __future__ import annotations

import argparse
import os
import signal

from speedmatrix._native import _core
from speedmatrix.cliargs import UsageError
from speedmatrix.errors import SpeedmatrixError

EXIT_OK = 0
#: nothing was measured, or the run could not start
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: some cells failed (status error) or were not run; the others were measured
EXIT_PARTIAL = 3
#: the signals that stop a run as Ctrl-C does; exit status 128 + the signal's number
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block on error; a user wants one line
    # that says what is wrong.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


class Formatter(argparse.HelpFormatter):
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


def command(
    sub: argparse._SubParsersAction, name: str, help: str, description: str, *examples: str
) -> argparse.ArgumentParser:
    """A command's parser: its one-line help, its description and its examples (one command
    line each, shown as written)."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog="examples:\n" + "".join(f"  {line}\n" for line in examples),
        formatter_class=Formatter,
    )


def value_flags(group: argparse._ActionsContainer, *rows: tuple[str, str, str]) -> None:
    """Flags that take one value, kept as typed (the command parses it, saying which flag
    was wrong): one (flag, metavar, help) row each."""
    for flag, metavar, text in rows:
        group.add_argument(flag, metavar=metavar, help=text)


def version_text() -> str:
    return f"speedmatrix {_core.version}"  # speedmatrix.__version__ reads the same


def api_key_of(args: argparse.Namespace) -> str | None:
    """The API key: --api-key-file, --api-key, $SPEEDMATRIX_API_KEY or $OPENAI_API_KEY."""
    if getattr(args, "api_key_file", None) is not None:
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
