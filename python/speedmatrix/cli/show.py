"""`speedmatrix show`: a saved run's grid in the terminal."""

from __future__ import annotations

import argparse

from speedmatrix.errors import SpeedmatrixError
from speedmatrix.results import load
from speedmatrix.runfile import RunFileError
from speedmatrix.show import grid_text


def command(args: argparse.Namespace) -> int:
    try:
        run = load(args.dir, strict=False)
    except RunFileError as exc:  # not valid JSON, a missing field: one line, status 1
        raise SpeedmatrixError(str(exc)) from None
    print(grid_text(run, where=str(args.dir)), end="")
    return 0
