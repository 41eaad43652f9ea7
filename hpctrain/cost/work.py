"""What one rank computes for one layer under a candidate grid: :class:`LocalWork` (pure data).

The layer kinds say what work a layer is and how its kernels are timed and counted; the compute
models (:mod:`hpctrain.cost.compute`) time or count it.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass


@dataclass(frozen=True)
class LocalWork:
    """One rank's kernel for one layer (kind ``sgd``: the optimizer's update of its shard;
    ``data``: producing the rank's block of the input batch).

    ``x``: local input shape (with halo rows for a height split); ``out``: output channels or
    features held locally (conv, linear); ``kernel``/``stride`` (height, width) and ``pads``
    (top, bottom, side) for window layers; ``need_dx``: whether the input gradient is computed
    (not for the first layer).
    """

    kind: str
    x: tuple[int, ...]
    out: int = 0
    kernel: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int] = (0, 0, 0)
    need_dx: bool = True

    def key(self) -> str:
        return "|".join(str(v) for v in astuple(self))

    def out_rows(self) -> tuple[int, int]:
        """Output height and width of a window kernel on ``x`` with ``pads``."""
        top, bottom, side = self.pads
        h, w = self.x[2], self.x[3]
        return ((h + top + bottom - self.kernel[0]) // self.stride[0] + 1,
                (w + 2 * side - self.kernel[1]) // self.stride[1] + 1)
