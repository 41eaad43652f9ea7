"""SGD with momentum and weight decay, applied to each rank's parameter shards."""

from __future__ import annotations

from typing import Any

from hpctrain.errors import UserError
from hpctrain.layers.base import Parameter


class SGD:
    """v ← μ·v + (g + λ·w);  w ← w − lr·v.  Element-wise, so shards give the serial result."""

    def __init__(self, params: list[Parameter], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0) -> None:
        self.check(lr, momentum, weight_decay)
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.velocity: list[Any] = [None] * len(params)
        self._scratch: dict[tuple, Any] = {}

    @staticmethod
    def check(lr: float, momentum: float, weight_decay: float) -> None:
        """Refuse settings that cannot train, naming the option."""
        if not lr > 0:
            raise UserError(f"--lr {lr} must be positive")
        if not 0 <= momentum < 1:
            raise UserError(f"--momentum {momentum} must be in [0, 1)")
        if not weight_decay >= 0:
            raise UserError(f"--weight-decay {weight_decay} must be non-negative")

    def step(self, lr: float | None = None) -> None:
        """One update of every shard, in place: the same operations, in the same order, as
        g = ∇ + λ·w; v = μ·v + g; w = w − lr·v, without a temporary array per operation
        (a step over AlexNet's 60 M parameters is memory-bound: each pass over them counts).
        The gradient buffers are overwritten; they are rebuilt by the next backward."""
        lr = self.lr if lr is None else lr
        xp = None
        for k, p in enumerate(self.params):
            xp = xp or _array_module(p.value)
            scratch = self._scratch_for(xp, p.value)
            g = p.grad
            if self.weight_decay:
                g += xp.multiply(p.value, self.weight_decay, out=scratch)
            if self.momentum:
                if self.velocity[k] is None:
                    self.velocity[k] = g.copy()
                else:
                    self.velocity[k] *= self.momentum
                    self.velocity[k] += g
                g = self.velocity[k]
            p.value -= xp.multiply(g, lr, out=scratch)

    def _scratch_for(self, xp: Any, like: Any) -> Any:
        """A reusable buffer shaped like ``like`` (one per shape and dtype)."""
        key = (like.shape, like.dtype.str)
        buffer = self._scratch.get(key)
        if buffer is None:
            buffer = self._scratch[key] = xp.empty_like(like)
        return buffer


def _array_module(a: Any) -> Any:
    """NumPy for a NumPy array, CuPy for a CuPy one."""
    import numpy as np

    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy
