"""``upsample scale=S | size=HxW | size=input[/K] [mode=nearest|bilinear] [align=0]``: an image or
volume resized as PyTorch's ``F.interpolate`` resizes it (ONNX's ``Resize``): by whole factors
``scale`` (``S``, ``HxW`` or ``DxHxW``) or to ``size``, nearest or (bi/tri)linear, ``align=1`` for
``align_corners=True``. A segmentation net's decoder (FCN, DeepLab). ``size=input`` is the net's
input size, and ``size=input/K`` that size divided by K, rounded up (the size K-fold striding
leaves, where DeepLab's pooled branch goes back): both follow ``--image-size``.

It follows its input's layout. Under a spatial split each rank computes its block of the output
rows from its input rows and the halo rows it reads beyond them (one, or none, from each
neighbour at an upsampling: :class:`~hpctrain.kernels.resize.Resampling`); an axis too short
for that is gathered first, as a pool's is."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctrain.cost.memory import Footprint
from hpctrain.cost.work import LocalWork
from hpctrain.errors import shown
from hpctrain.kernels.resize import Resampling
from hpctrain.layers.base import BuildContext, Layer
from hpctrain.layout.layout import Layout, Split, largest_block
from hpctrain.model.kinds.base import LayerSpec, Shape
from hpctrain.model.kinds.window import WindowKind, busiest_halo, following_layouts
from hpctrain.model.options import Key, NetError, flag, sizes, spread

MODES = ("nearest", "bilinear")  #: the resizing modes


def mode(key: str, text: str, where: str) -> str:
    """``key=text`` as one of the resizing modes, nearest or bilinear."""
    if text not in MODES:
        raise NetError(f"{where}: {key}={shown(text, 30)} must be {' or '.join(MODES)}")
    return text


@dataclass(frozen=True)
class UpsampleOptions:
    scale: tuple[int, ...]  # whole factors per axis; (0,): not given
    size: tuple[int, ...]  # the output's spatial sizes; (0,): not given
    mode: str
    align: bool
    # size=input/K: the net's input size divided by K (0: a size or a scale given)
    of_input: int = 0
    # made by resolve, not read from the file: the input's and the output's spatial sizes
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()

    def windows(self) -> list[Resampling]:
        """The resampling along each spatial axis (once resolved)."""
        return [Resampling(n, m, self.mode, self.align)
                for n, m in zip(self.inputs, self.outputs, strict=True)]


def input_divisor(text: str, where: str) -> int:
    """K of ``size=input/K`` (1 for ``size=input``)."""
    rest = text[len("input"):]
    if not rest:
        return 1
    if rest.startswith("/") and rest[1:].isdigit() and int(rest[1:]) >= 1:
        return int(rest[1:])
    raise NetError(f"{where}: upsample size={shown(text, 30)}: give size=HxW, size=input or "
                   f"size=input/K with K a whole number of at least 1")


def given(values: tuple[int, ...]) -> bool:
    return any(values)


class UpsampleKind(WindowKind):
    name = "upsample"
    keys = {"scale": Key(sizes(0), "0"), "size": Key(sizes(0), "0"), "mode": Key(mode, "nearest"),
            "align": Key(flag, "0")}
    options = UpsampleOptions

    def parse(self, texts: dict[str, str], where: str) -> Any:
        divisor = 0
        if texts.get("size", "").startswith("input"):
            texts = dict(texts)
            divisor = input_divisor(texts.pop("size"), where)
        options = dataclasses.replace(super().parse(texts, where), of_input=divisor)
        if given(options.scale) == (given(options.size) or divisor > 0):
            raise NetError(f"{where}: upsample takes scale=S (whole factors) or size=HxW (the "
                           f"output's size), one of them")
        if options.align and options.mode == "nearest":
            raise NetError(f"{where}: upsample align=1 aligns the corners of a bilinear resize; "
                           f"give mode=bilinear, or align=0")
        return options

    def option_texts(self, options: Any) -> dict[str, str]:
        """As every kind's, without the key not given (``scale`` or ``size``)."""
        texts = super().option_texts(options)
        for key in ("scale", "size"):
            if not given(getattr(options, key)):
                del texts[key]
        if options.of_input:
            texts["size"] = "input" + (f"/{options.of_input}" if options.of_input > 1 else "")
        return texts

    def resolve_in_net(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str,
                       net_input: Shape) -> LayerSpec:
        """``size=input/K`` made the net's input size divided by K (rounded up), then
        :meth:`resolve`."""
        k = spec.options.of_input
        if k and len(net_input) > 1:
            size = tuple(-(-n // k) for n in net_input[1:])
            spec = dataclasses.replace(spec, options=dataclasses.replace(spec.options, size=size))
        return self.resolve(spec, shapes, where)

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        """The factors or the size one per spatial axis, and both sizes kept."""
        o, shape = spec.options, shapes[0]
        if len(shape) < 2:
            raise NetError(f"{where}: layer {spec.name} (upsample) needs an image or volume "
                           f"input, got shape {shape}")
        inputs = tuple(shape[1:])
        if given(o.scale):
            scale = spread(o.scale, len(inputs), "scale", where, spec.name)
            if min(scale) < 1:
                raise NetError(f"{where}: layer {spec.name}: scale={'x'.join(map(str, scale))} "
                               f"must be whole factors of at least 1")
            outputs, size = tuple(n * s for n, s in zip(inputs, scale, strict=True)), o.size
        else:
            size = spread(o.size, len(inputs), "size", where, spec.name)
            if min(size) < 1:
                raise NetError(f"{where}: layer {spec.name}: size={'x'.join(map(str, size))} "
                               f"must be positive")
            scale, outputs = o.scale, size
        return dataclasses.replace(spec, options=dataclasses.replace(
            o, scale=scale, size=size, inputs=inputs, outputs=outputs))

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        return (shapes[0][0], *spec.options.outputs)

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        return following_layouts(spec, fed[0], out_shape)

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork:
        """The busiest rank's input rows with their halos, resized to its output block: the
        kernel's time follows the input block and the output block's per-axis sizes, kept as
        the work's ``kernel`` (no window slides here)."""
        x = inputs[0]
        block = list(largest_block(x))
        for axis in x.spatial_cuts:
            p = busiest_halo(spec, x, axis)
            block[axis] = p.need[1] - p.need[0]
        return LocalWork(self, tuple(block), resized=tuple(largest_block(output)[2:]),
                         need_dx=need_dx)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        """Per axis, a product by the (outputs × inputs) matrix, taken on the array resized so
        far: 2·inputs·outputs per row of it (the matrix is small; what dominates is the
        traffic, priced with the memory kinds)."""
        n, c, *size = work.x
        found, shape = 0.0, list(size)
        for k, m in enumerate(work.resized):
            found += 2.0 * n * c * math.prod(shape) * m
            shape[k] = m
        return found, found

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        from hpctrain.kernels.resize import resampling_matrix, resize_backward, resize_forward

        x = random(work.x)
        matrices = [xp.asarray(resampling_matrix(Resampling(n, m, "bilinear"), (0, m), (0, n)),
                               dtype=dtype) for n, m in zip(work.x[2:], work.resized, strict=True)]
        return (lambda: resize_forward(xp, x, matrices),
                lambda y: lambda: resize_backward(xp, y, matrices))

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        return {}, fp.phases({**fp.loose_input, "output and its partial resizes": 2 * fp.y},
                             {"output gradient, resized back": 2 * fp.y, "input gradient": fp.x})

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        from hpctrain.layers.upsample import Upsample  # needs MPI: only when run

        return Upsample(spec.name, spec.options, ctx)


KIND = UpsampleKind()
