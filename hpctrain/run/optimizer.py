"""SGD with momentum and weight decay, applied to each rank's parameter shards."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpctrain.errors import UserError
from hpctrain.kernels.sgd import Scratch, sgd_update
from hpctrain.layers.base import Parameter


class SGD:
    """v ← μ·v + (g + λ·w);  w ← w − lr·v.  Element-wise, so shards give the serial result
    (:func:`~hpctrain.kernels.sgd.sgd_update`).

    Under a mixed precision the update is made on the float32 master weights with a float32
    velocity, from the 16-bit gradient widened (and divided by the loss scale), and the
    kernels' 16-bit copy (``Parameter.value``) is then rounded from the master."""

    def __init__(self, params: list[Parameter], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0) -> None:
        self.check(lr, momentum, weight_decay)
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.velocity: list[Any] = [None] * len(params)
        self._index = {id(p): k for k, p in enumerate(params)}
        self._scratch = Scratch()

    @staticmethod
    def check(lr: float, momentum: float, weight_decay: float) -> None:
        """Refuse settings that cannot train, naming the option."""
        if not lr > 0:
            raise UserError(f"--lr {lr} must be positive")
        if not 0 <= momentum < 1:
            raise UserError(f"--momentum {momentum} must be in [0, 1)")
        if not weight_decay >= 0:
            raise UserError(f"--weight-decay {weight_decay} must be non-negative")

    def step(self, lr: float | None = None, params: list[Parameter] | None = None,
             unscale: float = 1.0) -> None:
        """One update of every shard (or of ``params``, some of them), in place, from the
        gradients times ``unscale`` (1 / the loss scale). The gradient buffers are overwritten;
        they are rebuilt by the next backward."""
        lr = self.lr if lr is None else lr
        for p in self.params if params is None else params:
            k = self._index[id(p)]
            self.velocity[k] = sgd_update(_array_module(p.weights), p.weights, p.grad,
                                          self.velocity[k], lr, self.momentum,
                                          self.weight_decay, self._scratch, unscale,
                                          copy=None if p.master is None else p.value)


def _array_module(a: Any) -> Any:
    """NumPy for a NumPy array, CuPy for a CuPy one."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy
