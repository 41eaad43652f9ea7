"""Element-wise layers: ReLU and dropout."""

from __future__ import annotations

from typing import Any

from hpctrain.kernels.counter_rng import uniform_block


def relu_forward(xp: Any, x: Any) -> Any:
    return xp.maximum(x, 0)


def relu_backward(xp: Any, y: Any, dy: Any) -> Any:
    return xp.where(y > 0, dy, 0)


def dropout_mask(xp: Any, key: int, p: float, shape: tuple[int, ...],
                 box: tuple[tuple[int, int], ...], dtype: Any) -> Any:
    """Inverted-dropout mask for block ``box`` of a global ``shape`` activation.

    Entry (n, ...) is kept with probability 1 - p, decided by the counter RNG at its global
    index, so sample n gets the same mask on every grid; kept entries are scaled by 1/(1 - p).
    """
    keep = uniform_block(xp, key, shape, box, dtype) >= p
    return keep.astype(dtype) * dtype(1.0 / (1.0 - p))
