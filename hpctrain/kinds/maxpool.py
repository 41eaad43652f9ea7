"""``maxpool kernel=K [stride=K] [pad=0]``: max-pooling (``K`` or ``HxW``); padding never wins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpctrain.kinds.base import BOOL_BYTES, Footprint, LayerSpec, larger
from hpctrain.kinds.options import NetError
from hpctrain.kinds.window import PoolKind, PoolOptions, padded_bytes, padded_copy_bytes


class MaxPoolKind(PoolKind):
    name = "maxpool"
    keeps_output = True

    def pool_kernels(self) -> tuple[Callable, Callable]:
        from hpctrain.kernels.pool import maxpool_backward, maxpool_forward

        return maxpool_forward, maxpool_backward

    def parse(self, texts: dict[str, str], where: str) -> PoolOptions:
        o = super().parse(texts, where)
        for pad, kernel in zip(o.pad, o.kernel, strict=True):
            if pad > kernel // 2:
                raise NetError(f"{where}: maxpool pad={pad} must be at most kernel // 2 = "
                               f"{kernel // 2}, or some windows would hold only padding")
        return o

    def keeps_input(self, spec: LayerSpec) -> bool:
        """Its windows view the input itself when nothing is padded."""
        return spec.options.pad == (0, 0)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """The output (the maxima) and the windows' input, kept; the masks of the backward."""
        work, b = fp.work, fp.itemsize
        n, c = work.x[:2]
        ho, wo = work.out_rows()
        y = n * c * ho * wo * b
        padded = padded_copy_bytes(fp)
        resident: dict[str, Any] = {"output": y}
        if padded:
            resident["padded input"] = padded  # a fresh copy its windows view
            forward = {**fp.loose_input, "padded input": padded, "output": y}
        else:  # the previous step's input, held by the previous windows, and the output
            forward = {"input": fp.x, "output": y}
        backward = {"output gradient": y, "padded input gradient": padded_bytes(work, b),
                    "window masks": y + 3 * y // b * BOOL_BYTES}
        return resident, larger(forward, backward)


KIND = MaxPoolKind()
