"""What one rank computes for one layer under a candidate grid:
:class:`~hpctrain.cost.work.LocalWork` (pure data), and the :class:`~hpctrain.cost.work.Operation`
that does it.

An operation is a layer kind (:mod:`hpctrain.model.kinds`), the optimizer's update of a layer's
shard, or producing a rank's block of the input batch; the registry of all of them is
:data:`hpctrain.model.operations.OPERATIONS`. Each says how its work is counted and run; the
compute models (:mod:`hpctrain.cost.compute`) count or time it through that, whatever it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hpctrain.kernels.sliding import out_size, spans

Shape = tuple[int, ...]
# forward() and backward_of(what forward returned) -> backward(): a kernel pair to time
Kernels = tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]


class Operation(Protocol):
    """What the compute models need of whatever does a :class:`LocalWork`."""

    name: str

    def flops(self, work: LocalWork) -> tuple[float, float]:
        """Forward and backward floating-point operations of ``work`` (a multiply-add is 2)."""
        ...

    def kernels(self, xp: Any, work: LocalWork, dtype: Any,
                random: Callable[[Shape], Any]) -> Kernels:
        """``forward()`` of ``work`` on data from ``random(shape)``, and ``backward_of(what
        forward returned)`` giving its ``backward()``, for compute timing."""
        ...


@dataclass(frozen=True)
class LocalWork:
    """One rank's share of one operation ``op`` (the busiest rank's, which sets the pace).

    ``x``: local input shape (with halo rows for a height split; the shard's shape for the
    update); ``out``: output channels or features held locally (conv, linear);
    ``kernel``/``stride`` (one per spatial axis) and ``pads`` ((before, after) per spatial
    axis) for window layers; ``need_dx``: whether the input gradient is computed (not for the
    first layer); a convolution's ``groups`` (those of its local channels) and ``dilation``
    (one per spatial axis; empty: none); a resize's output sizes per spatial axis
    (``resized``). A ``transposed`` convolution's ``pads`` are the (first, after) entries of
    its full output that it crops (:mod:`hpctrain.kernels.deconv`), negative where it keeps
    entries no input reaches.
    """

    op: Operation
    x: Shape
    out: int = 0
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    pads: tuple[tuple[int, int], ...] = ()
    need_dx: bool = True
    groups: int = 1
    dilation: tuple[int, ...] = ()
    resized: tuple[int, ...] = ()
    transposed: bool = False

    def key(self) -> str:
        """The work as text, the same in every process: part of a timing's cache key (a
        convolution's groups and dilation only where they are not 1, so that the keys of the
        rest stay as they were)."""
        fields = [self.op.name, self.x, self.out, self.kernel, self.stride, self.pads,
                  self.need_dx]
        if self.groups != 1:
            fields.append(f"groups {self.groups}")
        if any(step != 1 for step in self.dilation):
            fields.append(f"dilation {self.dilation}")
        if self.resized:
            fields.append(f"resized {self.resized}")
        if self.transposed:
            fields.append("transposed")
        return "|".join(str(v) for v in fields)

    def flops(self) -> tuple[float, float]:
        """Forward and backward floating-point operations, as the operation counts them."""
        return self.op.flops(self)

    def touched_elements(self) -> int:
        """Elements the work reads and writes once each: its input, its output and, for a
        weighted operation, its weights, and a convolution's im2col columns (every window of
        its input): whether they fit a rank's share of the cache decides how fast a training
        step runs it (:data:`~hpctrain.model.kinds.BEYOND_CACHE`)."""
        batch, channels = (self.x[0], self.x[1]) if len(self.x) > 1 else (1, self.x[0])
        positions = batch * math.prod(self.out_sizes() if self.kernel else self.x[2:])
        window = channels * math.prod(self.kernel)
        weights = self.out * window // self.groups
        columns = positions * window if self.out and self.kernel else 0
        if self.transposed:  # a column per input entry, of the output's window entries
            columns = batch * math.prod(self.x[2:]) * self.out * math.prod(self.kernel)
        return math.prod(self.x) + positions * (self.out or channels) + 2 * weights + columns

    def out_sizes(self) -> tuple[int, ...]:
        """Output size along each spatial axis of a window kernel on ``x`` with ``pads`` (of a
        transposed one: its full output, (n − 1)·s + span, less the entries cropped)."""
        if self.transposed:
            return tuple((n - 1) * s + span - first - after if n else -first - after
                         for n, s, span, (first, after)
                         in zip(self.x[2:], self.stride, spans(self.kernel, self.dilation or None),
                                self.pads, strict=True))
        return tuple(out_size(n, k, s, before, after) for n, k, s, (before, after)
                     in zip(self.x[2:], spans(self.kernel, self.dilation or None), self.stride,
                            self.pads, strict=True))
