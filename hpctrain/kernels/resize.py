"""Resizing images and volumes (PyTorch's ``F.interpolate``, ONNX's ``Resize``), nearest or
bilinear (trilinear on a volume), as one small matrix per spatial axis.

Resizing is separable: along each spatial axis an output entry is a weighted sum of at most two
input entries (:class:`Resampling`), so the whole resize is a
product by one (outputs × inputs) matrix per axis, and its adjoint a product by their
transposes. The matrices hold a rank's own output rows and the input rows it reads (its halo
included under a split), so the same kernel runs on a whole image and on a band of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hpctrain.kernels.products import matmul


@dataclass(frozen=True)
class Resampling:
    """Resizing along one axis from ``n_in`` entries to ``n_out`` (PyTorch's
    ``F.interpolate``): each output reads one input entry (``nearest``: ⌊o·n_in/n_out⌋) or two
    (``bilinear``: around (o + ½)·n_in/n_out − ½, clamped to the axis; ``align_corners``: around
    o·(n_in − 1)/(n_out − 1)). What its rows, output size and halos count, as a
    :class:`~hpctrain.layout.partition.Window`'s do for a sliding window; it never pads."""

    n_in: int
    n_out: int
    mode: str = "nearest"  # or "bilinear"
    align_corners: bool = False
    before: ClassVar[int] = 0
    after: ClassVar[int] = 0

    def out_size(self, n_in: int) -> int:
        return self.n_out if n_in == self.n_in else 0

    def sources(self, out: Any) -> tuple[Any, Any, Any]:
        """For output entries ``out`` (a NumPy array of indices): the first input entry each
        reads, the second (the first again for ``nearest``), and the second's weight."""
        out = np.asarray(out, dtype=np.float64)
        last = self.n_in - 1
        if self.mode == "nearest":
            # in float32, as PyTorch's nearest index is: a float64 ratio picks another row for
            # a few sizes (14 to 46, 26 to 22)
            ratio = np.float32(self.n_in) / np.float32(self.n_out)
            first = np.floor(out.astype(np.float32) * ratio).astype(np.int64)
            first = np.minimum(first, last)
            return first, first, np.zeros(out.shape)
        if self.align_corners:
            where = out * (last / (self.n_out - 1)) if self.n_out > 1 else out * 0.0
        else:
            where = np.maximum((out + 0.5) * (self.n_in / self.n_out) - 0.5, 0.0)
        first = np.minimum(np.floor(where).astype(np.int64), last)
        return first, np.minimum(first + 1, last), where - first

    def rows_needed(self, out_start: int, out_stop: int) -> tuple[int, int]:
        """Input rows that outputs [start, stop) read (the sources are monotone in the
        output)."""
        first, _, _ = self.sources([out_start])
        _, second, _ = self.sources([out_stop - 1])
        return int(first[0]), int(second[0]) + 1

    def __str__(self) -> str:
        corners = ", corners aligned" if self.align_corners else ""
        return f"{self.mode} {self.n_in} to {self.n_out}{corners}"


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
