"""``maxpool kernel=K [stride=K] [pad=0]``: max-pooling (``K`` or ``HxW``); padding never wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.kernels.pool import maxpool_backward, maxpool_forward
from hpctrain.kinds.base import BOOL_BYTES, Footprint, LayerSpec, larger
from hpctrain.kinds.options import Key, NetError, pair
from hpctrain.kinds.window import WINDOW_KEYS, PoolKind, padded_bytes


@dataclass(frozen=True)
class MaxPoolOptions:
    kernel: tuple[int, int]
    stride: tuple[int, int]  # 0 in the file: the kernel
    pad: tuple[int, int]


class MaxPoolKind(PoolKind):
    name = "maxpool"
    keys = {**WINDOW_KEYS, "stride": Key(pair(0), "0")}
    options = MaxPoolOptions
    keeps_output = True
    forward_kernel = maxpool_forward
    backward_kernel = maxpool_backward

    def parse(self, texts: dict[str, str], where: str) -> MaxPoolOptions:
        o = super().parse(texts, where)
        stride = tuple(s or k for s, k in zip(o.stride, o.kernel, strict=True))
        for pad, kernel in zip(o.pad, o.kernel, strict=True):
            if pad > kernel // 2:
                raise NetError(f"{where}: maxpool pad={pad} must be at most kernel // 2 = "
                               f"{kernel // 2}, or some windows would hold only padding")
        return MaxPoolOptions(o.kernel, stride, o.pad)

    def keeps_input(self, spec: LayerSpec) -> bool:
        """Its windows view the input itself when nothing is padded."""
        return spec.options.pad == (0, 0)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """The output (the maxima) and the windows' input, kept; the masks of the backward."""
        work, b = fp.work, fp.itemsize
        n, c, h, w = work.x
        top, bottom, side = work.pads
        ho, wo = work.out_rows()
        y = n * c * ho * wo * b
        padded = padded_bytes(work, b)
        resident: dict[str, Any] = {"output": y}
        if top or bottom or side or fp.height_split:
            resident["padded input"] = padded  # a fresh copy its windows view
            forward = {**fp.loose_input, "padded input": padded, "output": y}
        else:  # the previous step's input, held by the previous windows, and the output
            forward = {"input": fp.x, "output": y}
        backward = {"output gradient": y, "padded input gradient": padded,
                    "window masks": y + 3 * y // b * BOOL_BYTES}
        return resident, larger(forward, backward)


KIND = MaxPoolKind()
