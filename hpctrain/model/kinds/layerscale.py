"""``layerscale [init=1e-6]``: Y = γ ⊙ X with a trained scale γ per channel, broadcast over the
positions: ConvNeXt's and CaiT's layer scale, which lets a residual branch start near zero (γ
starts at ``init`` in every channel; torchvision's ConvNeXt at 1e-6).

γ has PyTorch's shape, one value per channel of the input's rank, (C, 1, …, 1) ((F,) for a flat
input), and its name, ``layer_scale`` (torchvision's CNBlock ``features.1.0.layer_scale``). It
runs on the layout that feeds it: a channel split holds its channels' γ, as a bias is held;
every other split holds all of them, and Δγ, a sum over the samples and positions, is a partial
sum on each rank, summed by the network over the ranks of the same channel block."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import Group
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS, Layout, largest_block
from hpctrain.model.kinds.base import Kind, LayerSpec, Shape
from hpctrain.model.options import Key, number

PARAMETER = "layer_scale"  #: γ's suffix, torchvision's name for it


@dataclass(frozen=True)
class LayerScaleOptions:
    init: float


def scale_shape(x: Shape) -> Shape:
    """γ's shape for an input of per-sample shape ``x``: (C, 1, …, 1), one axis per axis of
    ``x``, so that it broadcasts over the positions as PyTorch's does."""
    return (x[0], *(1,) * (len(x) - 1))


class LayerScaleKind(Kind):
    name = "layerscale"
    keys = {"init": Key(number, "1e-6")}
    options = LayerScaleOptions

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        return {PARAMETER: scale_shape(shapes[0])}

    def keeps_input(self, spec: LayerSpec) -> bool:
        return True  # Δγ = Σ ΔY ⊙ X

    def flops(self, work: LocalWork) -> tuple[float, float]:
        entries = float(math.prod(work.x))
        return entries, 3 * entries  # the product; ΔY·γ, and ΔY·X with its sum

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        from hpctrain.kernels.activations import layer_scale_backward

        x = random(work.x)
        gamma = random(scale_shape(work.x[1:]))
        return (lambda: x * gamma), (lambda y: lambda: layer_scale_backward(xp, y, x, gamma))

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        return largest_block(inputs[0])[CHANNEL_AXIS]

    def gradient_group(self, inputs: tuple[Layout, ...], output: Layout) -> Group:
        """γ is on every rank holding the same channel block: other samples, other positions,
        replicas."""
        x = inputs[0]
        return x.group(a for a in (*range(len(x.shape)), REPLICAS) if a != CHANNEL_AXIS)

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """X kept for Δγ; ΔY ⊙ X made before its sum."""
        return {}, fp.phases({**fp.loose_input, "output": fp.y},
                             {"output gradient": fp.y, "input gradient": fp.x,
                              "product with X": fp.x})

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """Δγ = Σ ΔY ⊙ X over the samples and positions: ``Σ |ΔY|·|X|``."""
        axes = (0, *range(2, dy.ndim))
        total = (np.abs(dy) * np.abs(xs[0])).sum(axis=axes)
        return {PARAMETER: total.reshape(scale_shape(xs[0].shape[1:]))}

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.layerscale import LayerScale  # needs MPI: only when run

        return LayerScale(spec.name, spec.options, ctx)


KIND = LayerScaleKind()
