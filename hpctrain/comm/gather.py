"""Assemble a distributed tensor whole on one rank (for verification and checkpoints)."""

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
