"""Element-wise layers (ReLU and the other pointwise functions, dropout) and flatten: they run on
the layout that feeds them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpctrain.kernels.activations import dropout_mask
from hpctrain.kernels.counter_rng import stream_key
from hpctrain.layers.base import Layer

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext

DROPOUT_STREAM = 2


class Pointwise(Layer):
    """Y = f(X) entry by entry: ``function(xp, x) -> y`` and ``derivative(xp, kept, dy) -> dx``,
    where ``kept`` is the output Y (``keeps="output"``), the input X (``keeps="input"``, for an
    f that is not one-to-one) or None (``keeps=""``) (see :mod:`hpctrain.kernels.activations`)."""

    mode = "follow"

    def __init__(self, name: str, ctx: BuildContext, function: Callable[[Any, Any], Any],
                 derivative: Callable[[Any, Any, Any], Any], keeps: str = "output") -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        self.function, self.derivative, self.keeps = function, derivative, keeps

    def forward(self, x: Any, step: int) -> Any:
        y = self.function(self.backend.xp, x)
        # not kept past the layers that read it, nor at all in evaluation
        kept = {"output": y, "input": x}.get(self.keeps)
        self.kept = kept if self.training else None
        return y

    def backward(self, dy: Any) -> Any:
        return self.derivative(self.backend.xp, self.kept, dy)


class Dropout(Layer):
    """Inverted dropout whose mask for each sample depends on (seed, layer, step) only."""

    mode = "follow"

    def __init__(self, name: str, p: float, ctx: BuildContext) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        self.p, self.key = p, ctx.key
        self.box = self.in_layout.box(ctx.rank)

    def forward(self, x: Any, step: int) -> Any:
        if not self.training or self.p == 0:
            self.mask = None
            return x
        self.mask = dropout_mask(self.backend.xp, stream_key(self.key, DROPOUT_STREAM, step),
                                 self.p, self.in_layout.shape, self.box, self.backend.dtype)
        return x * self.mask

    def backward(self, dy: Any) -> Any:
        return dy if self.mask is None else dy * self.mask


class Flatten(Layer):
    """(N, C, H, W) -> (N, C·H·W), C-major (and a volume's (N, C, D, H, W) likewise). A
    channel split becomes a feature split.

    A height-split input cannot be flattened in place (its rows are not contiguous features), so
    flatten asks for the rows gathered first: its input layout drops the height split.
    """

    mode = "follow"

    def __init__(self, name: str, ctx: BuildContext) -> None:
        self.name, self.params = name, []
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output

    def forward(self, x: Any, step: int) -> Any:
        self.x_shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy: Any) -> Any:
        return dy.reshape(self.x_shape)
