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
        lr = self.lr if lr is None else lr
        for k, p in enumerate(self.params):
            g = p.grad + self.weight_decay * p.value if self.weight_decay else p.grad
            if self.momentum:
                self.velocity[k] = g.copy() if self.velocity[k] is None else (
                    self.momentum * self.velocity[k] + g)
                g = self.velocity[k]
            p.value -= lr * g
