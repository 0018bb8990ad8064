"""The `run` flags of the sparse plan (`speedmatrix.sparseaxes`, `speedmatrix.twin.sparse`):
``--plan full|sparse``, ``--sparse-target``, ``--sparse-max-cells``. Each sets a matrix
field; a bad value is one line naming the flag."""

from __future__ import annotations

import argparse
from typing import Any

from speedmatrix.cli.common import value_flags
from speedmatrix.cliargs import UsageError, positive_int
from speedmatrix.sparseaxes import PLANS

__all__ = ["SPARSE_FLAGS", "add_sparse_flags", "apply_sparse_flags"]

#: (argparse attribute, matrix field, the flag as typed)
SPARSE_FLAGS = (
    ("plan", "plan", "--plan"),
    ("sparse_target", "sparse_target", "--sparse-target"),
    ("sparse_max_cells", "sparse_max_cells", "--sparse-max-cells"),
)


def add_sparse_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "plan",
        "sparse: measure a small design (corners and the knee), fit the built-in engine's "
        "profile, predict the rest; the report marks predicted cells (docs/metrics.md)",
    )
    g.add_argument("--plan", choices=PLANS, help="full (default) or sparse")
    value_flags(
        g,
        (
            "--sparse-target",
            "FRACTION",
            (
                "sparse: measure more cells until every predicted cell's interval is within this "
                "relative half-width, e.g. 0.10 or 10%% (default 0.10)"
            ),
        ),
        (
            "--sparse-max-cells",
            "N",
            "sparse: the most decode cells measured (default: 40%% of the grid)",
        ),
    )


def apply_sparse_flags(m: Any, args: argparse.Namespace) -> None:
    """The plan flags onto matrix ``m``; UsageError (one line) on a bad value."""
    if getattr(args, "plan", None):
        m.plan = args.plan
    text = getattr(args, "sparse_target", None)
    if text:
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise UsageError(f"--sparse-target: {text!r} is not a fraction, e.g. 0.10") from None
        m.sparse_target = value
    if getattr(args, "sparse_max_cells", None):
        m.sparse_max_cells = positive_int(args.sparse_max_cells, "--sparse-max-cells")
