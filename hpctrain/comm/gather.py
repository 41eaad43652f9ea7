"""A distributed tensor whole on one rank, or the whole on one rank cut into every rank's block:
verification, checkpoints, starting weights and predictions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from hpctrain.device.backend import Backend
from hpctrain.layout.layout import Box, box_size, relative_slices


def gather_to_root(backend: Backend, comm: MPI.Comm, local: Any, shape: tuple[int, ...],
                   box_of: Callable[[int], Box], combine: str, root: int = 0,
                   dtype: Any = np.float64) -> np.ndarray | None:
    """The global ``shape`` tensor on ``root`` (None elsewhere), in ``dtype`` on the host.

    ``combine='copy'`` for values: replicas hold equal blocks and any one will do.
    ``combine='sum'`` for gradients of replicated tensors, held as partial sums over replicas.
    """
    size = comm.Get_size()
    boxes = [box_of(r) for r in range(size)]
    counts = [box_size(b) for b in boxes]
    send = np.ascontiguousarray(backend.to_numpy(local), dtype=dtype).ravel()
    if send.size != counts[comm.Get_rank()]:
        raise RuntimeError(f"local block of {send.size} entries does not fit its box "
                         f"{boxes[comm.Get_rank()]}")
    recv = np.empty(sum(counts), dtype) if comm.Get_rank() == root else None
    comm.Gatherv(send, [recv, counts] if recv is not None else None, root=root)
    if recv is None:
        return None
    whole = np.zeros(shape, dtype)
    start = 0
    full = tuple((0, n) for n in shape)
    for box, count in zip(boxes, counts, strict=True):
        block = recv[start:start + count].reshape([hi - lo for lo, hi in box])
        if combine == "sum":
            whole[relative_slices(box, full)] += block
        else:
            whole[relative_slices(box, full)] = block
        start += count
    return whole


def block_from_root(comm: MPI.Comm, whole: np.ndarray | None, shape: tuple[int, ...],
                    box: Box, dtype: Any, root: int = 0) -> np.ndarray:
    """This rank's block ``box`` of a tensor of ``shape`` held whole on ``root`` (``whole``;
    None elsewhere), in ``dtype`` on the host.

    One ``Bcast`` of the whole tensor, each rank keeping its block: a tree of O(log P) steps,
    where a ``Scatterv`` would send the root's every replica of a block again (a weight
    replicated over 4096 batch ranks, 4096 times). Each rank holds one whole tensor for a
    moment; a caller going through several holds one at a time.
    """
    buffer = (np.ascontiguousarray(whole, dtype=dtype) if comm.Get_rank() == root
              else np.empty(shape, dtype))
    comm.Bcast(buffer, root=root)
    return buffer[relative_slices(box, tuple((0, n) for n in shape))].copy()


class RowsToRoot:
    """Rows of a batch whole on ``root``: each rank sends the rows it owns (``rows``: its
    (lo, hi) of the batch axis, (0, 0) where another rank owns them), one copy of each, and
    the root places them. The root works out where every rank's rows go once, at set-up;
    every other rank knows only its own."""

    def __init__(self, comm: MPI.Comm, rows: tuple[int, int], rows_of: Callable[[int], tuple],
                 width: int, batch: int, root: int = 0) -> None:
        self.comm, self.root, self.width, self.batch = comm, root, width, batch
        self.count = (rows[1] - rows[0]) * width
        self.places: list[tuple[int, int]] = []
        if comm.Get_rank() == root:
            self.places = [rows_of(r) for r in range(comm.Get_size())]

    def __call__(self, block: np.ndarray) -> np.ndarray | None:
        """The (batch, width) float32 array on the root from every rank's ``block`` (its rows,
        or anything of no rows where it owns none); None elsewhere."""
        send = np.ascontiguousarray(block, dtype=np.float32).reshape(-1)[:self.count]
        if self.comm.Get_rank() != self.root:
            self.comm.Gatherv(send, None, root=self.root)
            return None
        counts = [(b - a) * self.width for a, b in self.places]
        recv = np.empty(sum(counts), np.float32)
        self.comm.Gatherv(send, [recv, counts], root=self.root)
        whole = np.empty((self.batch, self.width), np.float32)
        start = 0
        for (a, b), count in zip(self.places, counts, strict=True):
            whole[a:b] = recv[start:start + count].reshape(b - a, self.width)
            start += count
        return whole
