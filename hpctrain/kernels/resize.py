"""Resizing images and volumes (PyTorch's ``F.interpolate``, ONNX's ``Resize``), nearest or
bilinear (trilinear on a volume), as one small matrix per spatial axis.

Resizing is separable: along each spatial axis an output entry is a weighted sum of at most two
input entries (:class:`~hpctrain.layout.partition.Resampling`), so the whole resize is a
product by one (outputs × inputs) matrix per axis, and its adjoint a product by their
transposes. The matrices hold a rank's own output rows and the input rows it reads (its halo
included under a split), so the same kernel runs on a whole image and on a band of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpctrain.kernels.products import matmul
from hpctrain.layout.partition import Resampling


def resampling_matrix(resampling: Resampling, out: tuple[int, int], rows: tuple[int, int]
                      ) -> np.ndarray:
    """The (outputs × inputs) float64 matrix of ``resampling`` for output entries ``out`` =
    [start, stop) from input entries ``rows`` = [start, stop), which must hold every entry
    they read."""
    indices = np.arange(*out)
    first, second, weight = resampling.sources(indices)
    if len(indices) and (first.min() < rows[0] or second.max() >= rows[1]):
        raise ValueError(f"outputs {out} of {resampling} read beyond input rows {rows}")
    matrix = np.zeros((len(indices), rows[1] - rows[0]))
    here = np.arange(len(indices))
    np.add.at(matrix, (here, first - rows[0]), 1.0 - weight)
    np.add.at(matrix, (here, second - rows[0]), weight)
    return matrix


def resize_forward(xp: Any, x: Any, matrices: Sequence[Any]) -> Any:
    """Y = X resized along each spatial axis k by ``matrices[k]`` (outputs × inputs of that
    axis): X (N, C, S1, …, Sd) → Y (N, C, P1, …, Pd), contiguous."""
    return _along_axes(xp, x, [m.T for m in matrices])


def resize_backward(xp: Any, dy: Any, matrices: Sequence[Any]) -> Any:
    """dX of :func:`resize_forward`: dY taken back through each axis's matrix transposed."""
    return _along_axes(xp, dy, list(matrices))


def _along_axes(xp: Any, a: Any, right: list[Any]) -> Any:
    """``a`` with each spatial axis k multiplied on the right by ``right[k]``: the axis moved
    last, a matrix product, moved back."""
    for k, m in enumerate(right):
        axis = 2 + k
        moved = xp.moveaxis(a, axis, -1)
        shape = moved.shape
        product = matmul(xp, xp.ascontiguousarray(moved).reshape(-1, shape[-1]), m)
        a = xp.moveaxis(product.reshape(*shape[:-1], m.shape[1]), -1, axis)
    return xp.ascontiguousarray(a)
