"""A twin of a measured server: the built-in engine's model evaluated directly (issue 24)."""

from speedmatrix.twin.model import PredictedCell, predict_cell, predict_matrix

__all__ = ["PredictedCell", "predict_cell", "predict_matrix"]
