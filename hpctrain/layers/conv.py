"""Convolution of images or volumes in batch, model (1.5D) or domain mode."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hpctrain.kernels import cudnn_conv
from hpctrain.kernels.conv import conv_backward, conv_forward
from hpctrain.layers.base import weight_and_bias
from hpctrain.layers.partial import InputSplitLayer
from hpctrain.layers.rows import WindowRows
from hpctrain.layout.layout import shared_channel_digits

if TYPE_CHECKING:
    from hpctrain.layers.base import BuildContext


class Conv(InputSplitLayer):
    """Y = W ⋆ X + b under any split of its output's samples, channels and spatial axes; shown
    for the 1.5D grids of images, and the same for volumes with a depth axis before H (the axis
    a domain split cuts is then the depth).

    Any split: W: (O/c, C, k…) on the ranks holding output channel block i of c; X: the output's
    spatial block plus halos (every channel); Y: its block. ΔW, Δb summed over every rank that
    holds the same block of W; ΔX a partial sum over the c channel blocks, summed by the move's
    adjoint; halo gradients go back to their owners, the split axes in reverse order.

    batch/model (1.5D; batch is Pr = 1):
        W: (O/Pr, C, kh, kw), b: (O/Pr,) — output channels split over Pr, replicated over Pc.
        X: (N/Pc, C, H, W) replicated over Pr;  Y: (N/Pc, O/Pr, Ho, Wo).
        ΔW, Δb summed over Pc (by the network, in flight). ΔX is a partial sum Wᵢᵀ ⋆ ΔYᵢ; the
        adjoint of whatever replicated X over Pr (an all-gather) sums it — a reduce-scatter.
    domain:
        W: (O, C, kh, kw), b: (O,) on every rank.
        X: (N/Pc, C, H/Pr, W) plus halo rows from the neighbours;  Y: (N/Pc, O, Ho/Pr, Wo).
        ΔW, Δb summed over all P (by the network); halo gradients go back to their owners.
    input split (``i=`` or ``s=``):
        W: (O/c, C/q, k…) and X's channels cut q ways; W ⋆ X is a partial sum, completed over
        the q ranks by :class:`~hpctrain.layers.partial.InputSum` before b is added; ΔX stays
        cut as X is.
    grouped (G groups; depthwise when G = C):
        W: (O/c, C/G, k…), G/c whole groups a rank; X cut along its channels as Y is, so each
        rank reads its own groups' inputs and ΔX is whole on it, with no sum.
    """

    def __init__(self, name: str, options: Any, ctx: BuildContext) -> None:
        self.name, self.mode, self.backend = name, ctx.mode, ctx.backend
        (self.in_layout,), self.out_layout = ctx.inputs, ctx.output
        c, out = self.in_layout.shape[1], self.out_layout
        self.stride = options.stride
        self.dilation = options.dilation if any(d != 1 for d in options.dilation) else None
        # each rank computes whole groups: all of them, or G/c under a split of the channels
        self.groups = max(1, options.groups // out.parts[1])
        self.rows = WindowRows.of(ctx.backend, ctx.grids, self.in_layout, options, name)
        shape = (options.out, c // options.groups, *options.kernel)
        # a grouped layer's input is cut with its groups: nothing to sum (ConvKind.check)
        split = self.input_split(ctx, shape) if options.groups == 1 else None
        # Wᵢ is on every rank that holds the same block of output channels
        self.grad_comm = ctx.grids.over(out, shared_channel_digits(out))
        self.weight, self.bias = weight_and_bias(
            ctx.backend, name, shape, options.bias, out, ctx.rank, ctx.key, split)
        self.params = [p for p in (self.weight, self.bias) if p is not None]
        # the bias the kernel adds (under an input split, the sum adds it once, after)
        self.kernel_bias = self.bias if self.sum is None else None
        self.rank = ctx.rank
        # on a GPU (CuPy arrays) the convolutions run as cuDNN graphs, built for the whole
        # local block now and for each other band shape on first use; im2col where cuDNN
        # cannot, or everywhere with HPCTRAIN_CONV=im2col
        self.use_cudnn = (getattr(ctx.backend.xp, "__name__", "") == "cupy"
                          and os.environ.get("HPCTRAIN_CONV", "cudnn") != "im2col"
                          and self._cudnn_ready())

    def _cudnn_ready(self) -> bool:
        """Whether this layer may use cuDNN graphs: cuDNN loads, and (without a spatial
        split, whose bands are built on first use) cuDNN accepts the whole local block."""
        if self.groups > 1 or self.dilation is not None:
            _say_once(self.rank, "grouped and dilated convolutions run as im2col (the cuDNN "
                      "graphs take plain ones)")
            return False
        reason = cudnn_conv.unavailable()
        if reason is not None:
            _say_once(self.rank, f"convolutions use im2col: {reason}")
            return False
        if self.in_layout.spatial_cuts:
            return True
        # the one band: every row, padded as WindowRows pads it (the rows the windows read)
        rows = self.rows
        lo, hi = rows.window.rows_needed(0, rows.n_out)
        pads = ((max(0, -lo), max(0, hi - rows.n_rows)), *rows.other_pads)
        key = cudnn_conv.key_of(self.in_layout.local_shape(self.rank), self.weight.value.shape,
                                self.stride, pads, self.backend.dtype, self.backend.precision)
        try:
            cudnn_conv.graphs_for(key)
        except cudnn_conv.ConvRefused as refused:
            _say_once(self.rank, f"{self.name}: im2col convolution: {refused}")
            return False
        return True

    def _forward_rows(self, x: Any, pads: tuple[tuple[int, int], ...]) -> tuple[Any, Any]:
        b = self.kernel_bias.value if self.kernel_bias is not None else None
        if self.use_cudnn:
            try:
                return cudnn_conv.cudnn_conv_forward(x, self.weight.value, b, self.stride, pads,
                                                     self.backend.precision)
            except cudnn_conv.ConvRefused as refused:  # this band's shape: im2col from now on
                _say_once(self.rank, f"{self.name}: im2col convolution: {refused}", everywhere=True)
        return conv_forward(self.backend.xp, x, self.weight.value, b, self.stride, pads,
                            dilation=self.dilation, groups=self.groups)

    def _backward_rows(self, dy: Any, cache: Any) -> Any:
        xp = self.backend.xp
        first = self.weight.grad is None
        dw_out = self.weight.grad_buffer(xp) if first else None
        if isinstance(cache, cudnn_conv.CudnnCache):  # the forward ran this band on cuDNN
            dx, dw, db = cudnn_conv.cudnn_conv_backward(dy, self.weight.value, cache,
                                                        self.need_dx, dw_out,
                                                        self.kernel_bias is not None)
        else:
            dx, dw, db = conv_backward(xp, dy, self.weight.value, cache, self.stride,
                                         self.need_dx, dw_out)
        # one band (no height split) gives the gradients whole; row bands add up
        if first:
            self.weight.grad = dw
        else:
            self.weight.grad += dw  # the kept buffer the first band wrote
        if self.kernel_bias is not None:
            self.bias.grad = db if self.bias.grad is None else self.bias.grad + db
        return dx

    def forward(self, x: Any, step: int) -> Any:
        y, bands = self.rows.forward(x, self._forward_rows)
        self.bands = bands if self.training else None  # evaluation keeps nothing for a backward
        return y if self.sum is None else self.sum.forward(y, self.bias)

    def backward(self, dy: Any) -> Any:
        for p in self.params:
            p.grad = None
        if self.sum is not None:
            dy = self.sum.backward(dy, self.bias)
        return self.rows.backward(dy, self.bands, self._backward_rows, self.need_dx)


_SAID: set[str] = set()


def _say_once(rank: int, line: str, everywhere: bool = False) -> None:
    """Print ``line`` once per process: on rank 0 only for what every rank finds alike (set-up),
    on any rank, named, for what only some ranks meet (a band's shape)."""
    if line in _SAID or not (everywhere or rank == 0):
        return
    _SAID.add(line)
    print(line if rank == 0 and not everywhere else f"rank {rank}: {line}", flush=True)
