"""Errors speedmatrix reports to its user as one line (the CLI exits 1)."""

from __future__ import annotations


class SpeedmatrixError(Exception):
    """A failure that is the target's or the environment's, not a bug."""


class TargetError(SpeedmatrixError):
    """The server cannot be reached, refuses us, or does not serve the model."""
