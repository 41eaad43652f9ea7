"""``linear out=F [bias=1]``: a fully connected layer, in batch, model (1.5D) or replicated
mode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import Group
from hpctrain.cost.work import LocalWork
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import (
    CHANNEL_AXIS,
    Layout,
    Split,
    largest_block,
    shared_channel_digits,
)
from hpctrain.layout.partition import check_split
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.weighted import SplitsInputs
from hpctrain.model.options import Key, NetError, flag, whole


@dataclass(frozen=True)
class LinearOptions:
    out: int
    bias: bool


class LinearKind(SplitsInputs):
    name = "linear"
    keys = {"out": Key(whole(1)), "bias": Key(flag, "1")}
    options = LinearOptions
    weighted = True
    modes = ("model", "replicated")
    grid_key = "fc"
    fallbacks = {"model": "replicated", "split": "replicated"}  # fewer outputs than Pr

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        if len(shapes[0]) != 1:
            raise NetError(f"{where}: layer {spec.name} (linear) needs a flat input, got shape "
                           f"{shapes[0]}; add a 'flatten' line before it")
        return (spec.options.out,)

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        o = spec.options
        found = {"weight": (o.out, shapes[0][0])}
        return {**found, "bias": (o.out,)} if o.bias else found

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """X cut along the batch only, its features whole; Y split by output features as
        ``split`` says (model), and replicated where it has replicas: each copy computes its
        block for its samples (replicated), which a layer with fewer outputs than Pr needs (a
        regression head of 4 targets on 64 ranks). An input split cuts X's features too, and
        leaves Y replicated over the ranks that sum it, or cut further by a reduce-scatter."""
        return self.split_layouts(fed, out_shape, split, ())

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        super().check(spec, inputs, output)
        check_split(spec.options.out, output.parts[CHANNEL_AXIS], "output features", spec.name)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        out = self.output_rows(spec, inputs, output)  # F_out/Pr, the busiest rank's
        return LocalWork(self, largest_block(inputs[0]), out, need_dx=need_dx)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        forward = 2.0 * work.x[0] * work.x[1] * work.out
        return forward, forward * (2 if work.need_dx else 1)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        # only timing runs the kernels: planning never loads them
        from hpctrain.kernels.linear import linear_backward, linear_forward

        x, w = random(work.x), random((work.out, work.x[1]))
        b = xp.zeros(work.out, dtype=dtype)
        dy = xp.ones((work.x[0], work.out), dtype=dtype)
        dw = xp.empty_like(w)  # kept across steps, as the layer's gradient is
        return (lambda: linear_forward(xp, x, w, b),
                lambda _: lambda: linear_backward(xp, x, w, dy, work.need_dx, dw))

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        split = self.split_parameters(spec, inputs, output)
        if split is not None:
            return split
        per_out = inputs[0].shape[CHANNEL_AXIS] + (1 if spec.options.bias else 0)
        return per_out * largest_block(output)[CHANNEL_AXIS]

    def gradient_group(self, inputs: tuple[Layout, ...], output: Layout) -> Group:
        """Wᵢ is replicated on the Pc ranks of a model row; replicated, W is on every rank
        (each replica's gradient a partial sum, as its output gradient is)."""
        return output.digit_group(shared_channel_digits(output))

    def keeps_input(self, spec: LayerSpec) -> bool:
        return True  # X for ΔW

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """The output (under an input split its rows before the sum, which a reduce-scatter then
        cuts) and, backward, its gradient (gathered back to those rows) and the input's."""
        y = max(fp.y, fp.work.x[0] * fp.work.out * fp.itemsize)
        backward = {"output gradient": y, "input gradient": fp.x if fp.work.need_dx else 0}
        return {}, fp.phases({"input": fp.x, "output": y}, backward)

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """ΔW = dYᵀX and Δb = Σₙ dY: their magnitudes are ``|dY|ᵀ|X|`` and ``Σₙ |dY|``."""
        found = {"weight": np.abs(dy).T @ np.abs(xs[0])}
        return {**found, "bias": np.abs(dy).sum(axis=0)} if spec.options.bias else found

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.linear import Linear  # needs MPI: only when run

        return Linear(spec.name, spec.options, ctx)


KIND = LinearKind()
