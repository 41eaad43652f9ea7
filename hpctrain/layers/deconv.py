"""Transposed convolution of images or volumes in batch, model (1.5D) or domain mode."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hpctrain.kernels.counter_rng import stream_key
from hpctrain.kernels.deconv import deconv_backward, deconv_forward
from hpctrain.layers.base import Layer, init_parameter
from hpctrain.layers.rows import HaloBlock
from hpctrain.layout.layout import CHANNEL_AXIS, Layout, shared_channel_digits

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class Deconv(Layer):
    """Y = Wᵀ ⋆ X + b (the adjoint of a convolution by W, with respect to its input, then
    cropped) under any split of its output's samples, channels and spatial axes.

    W: (C, O/c, k…), its columns cut as Y's channels are (c ways; grouped: (C/c, O/G, k…), whole
    groups); X: the output's spatial block of every input row that reaches it (its own rows
    and halo rows from the neighbours, each split axis exchanged in turn, the last first),
    every channel (grouped: its groups' channels); Y: its block. ΔW, Δb summed over every rank
    that holds the same block of W; ΔX a partial sum over the c channel blocks, summed by the
    move's adjoint; halo gradients go back to their owners, the split axes in reverse order.
    """

    def __init__(self, name: str, options: Any, ctx: BuildContext, weight_layout: Layout
                 ) -> None:
        self.name, self.mode, self.backend = name, ctx.mode, ctx.backend
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        x, out, rank = self.in_layout, self.out_layout, ctx.rank
        self.stride = options.stride
        self.dilation = options.dilation if any(d != 1 for d in options.dilation) else None
        self.groups = max(1, options.groups // out.parts[CHANNEL_AXIS])
        windows = options.windows()
        self.block = HaloBlock(ctx.backend, ctx.grids, x, windows, name)
        self.crop = tuple(w.crop(r, o) for w, r, o in zip(windows, self.block.rows,
                                                          self.block.outs, strict=True))
        shape = weight_layout.shape
        # U(±1/√fan_in), PyTorch's default, whose fan-in of a (C, O/G, K…) weight is O/G·K
        bound = 1.0 / math.sqrt(math.prod(shape[1:]))
        self.weight = init_parameter(ctx.backend, f"{name}.weight", shape, None, rank,
                                     stream_key(ctx.key, 0), bound, weight_layout)
        self.bias = (init_parameter(ctx.backend, f"{name}.bias", (options.out,), out, rank,
                                    stream_key(ctx.key, 1), bound) if options.bias else None)
        self.params = [p for p in (self.weight, self.bias) if p is not None]
        # W's block is on every rank that holds the same block of output channels
        self.grad_comm = ctx.grids.over(out, shared_channel_digits(out))

    def forward(self, x: Any, step: int) -> Any:
        x = self.block.extend(x)
        b = None if self.bias is None else self.bias.value
        y, cache = deconv_forward(self.backend.xp, x, self.weight.value, b, self.stride,
                                  self.crop, self.dilation, self.groups)
        self.cache = cache if self.training else None  # evaluation keeps nothing
        return y

    def backward(self, dy: Any) -> Any:
        xp = self.backend.xp
        dx, dw, db = deconv_backward(xp, dy, self.weight.value, self.cache, self.need_dx,
                                     self.weight.grad_buffer(xp))
        self.weight.grad = dw
        if self.bias is not None:
            self.bias.grad = db
        return self.block.give_back(dx) if self.need_dx else None

