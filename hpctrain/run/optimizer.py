"""SGD with momentum and weight decay, applied to each rank's parameter shards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from hpctrain.errors import UserError
from hpctrain.layers.base import Parameter

# entries per block of the CPU update: w, g, v and scratch in float32 take 1 MiB, which stays in
# a core's L2 or its share of L3. Measured cold over 24 M parameters: 42.5 ms against 52.6 ms
# whole; blocks of 4 Ki entries lose (80 ms) to the Python call per operation
CPU_BLOCK = 1 << 16


class SGD:
    """v ← μ·v + (g + λ·w);  w ← w − lr·v.  Element-wise, so shards give the serial result."""

    def __init__(self, params: list[Parameter], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0) -> None:
        self.check(lr, momentum, weight_decay)
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.velocity: list[Any] = [None] * len(params)
        self._index = {id(p): k for k, p in enumerate(params)}
        self._scratch: dict[tuple[str, str], Any] = {}

    @staticmethod
    def check(lr: float, momentum: float, weight_decay: float) -> None:
        """Refuse settings that cannot train, naming the option."""
        if not lr > 0:
            raise UserError(f"--lr {lr} must be positive")
        if not 0 <= momentum < 1:
            raise UserError(f"--momentum {momentum} must be in [0, 1)")
        if not weight_decay >= 0:
            raise UserError(f"--weight-decay {weight_decay} must be non-negative")

    def step(self, lr: float | None = None, params: list[Parameter] | None = None) -> None:
        """One update of every shard (or of ``params``, some of them), in place: the same
        operations, in the same order, as g = ∇ + λ·w; v = μ·v + g; w = w − lr·v, without a
        temporary array per operation.

        A step over tens of millions of parameters is memory-bound: done an operation at a time
        over whole arrays it reads and writes each of w, g, v about four times. On the CPU it
        goes a block of :data:`CPU_BLOCK` entries at a time instead, every operation on a block
        while the block is in cache, so each array crosses the memory bus about once (the
        numbers are the same: every entry sees the same operations in the same order). On a
        GPU whole arrays, since each operation is a kernel launch. The gradient buffers are
        overwritten; they are rebuilt by the next backward."""
        lr = self.lr if lr is None else lr
        for p in self.params if params is None else params:
            k = self._index[id(p)]
            xp = _array_module(p.value)
            first = bool(self.momentum) and self.velocity[k] is None
            if first:  # μ·0 + g is g: the first velocity is the gradient itself
                self.velocity[k] = xp.empty_like(p.value)
            velocity = self.velocity[k] if self.momentum else None
            scratch = None
            for w, g, v in _blocks(xp, p.value, p.grad, velocity):
                if scratch is None or scratch.shape != w.shape:  # the first and the last block
                    scratch = self._scratch_for(xp, w.size, w.dtype)[:w.size].reshape(w.shape)
                self._update(xp, w, g, v, scratch, lr, first)

    def _update(self, xp: Any, w: Any, g: Any, v: Any, scratch: Any, lr: float,
                first: bool) -> None:
        """The step on one block: w, g, v and a scratch array of the same shape."""
        if self.weight_decay:
            g += xp.multiply(w, self.weight_decay, out=scratch)
        if self.momentum:
            if first:
                v[...] = g
            else:
                v *= self.momentum
                v += g
            g = v
        w -= xp.multiply(g, lr, out=scratch)

    def _scratch_for(self, xp: Any, size: int, dtype: Any) -> Any:
        """A reusable flat buffer of at least ``size`` entries of ``dtype``: one per dtype,
        grown when a larger block comes."""
        key = (xp.__name__, np.dtype(dtype).str)
        buffer = self._scratch.get(key)
        if buffer is None or buffer.size < size:
            buffer = self._scratch[key] = xp.empty(size, dtype=dtype)
        return buffer


def _blocks(xp: Any, w: Any, g: Any, v: Any) -> Iterator[tuple[Any, Any, Any]]:
    """(w, g, v) whole, or on the CPU in blocks of :data:`CPU_BLOCK` entries (flat views of
    contiguous arrays); ``v`` may be None (no momentum)."""
    arrays = [w, g] if v is None else [w, g, v]
    if xp is not np or not all(a.flags.c_contiguous for a in arrays):
        yield w, g, v
        return
    w, g = w.reshape(-1), g.reshape(-1)
    v = None if v is None else v.reshape(-1)
    for start in range(0, w.size, CPU_BLOCK):
        part = slice(start, start + CPU_BLOCK)
        yield w[part], g[part], None if v is None else v[part]


def _array_module(a: Any) -> Any:
    """NumPy for a NumPy array, CuPy for a CuPy one."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy
