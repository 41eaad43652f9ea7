"""What a layer kind is: the contract every module of :mod:`hpctrain.model.kinds` fulfils.

A kind is one object that knows, for a layer of that kind:

- its typed options (:attr:`Kind.keys`, read into the frozen dataclass :attr:`Kind.options`,
  made exact for its input's shape by :meth:`Kind.resolve`);
- shape inference (:meth:`Kind.out_shape`) and its parameters and buffers, whole;
- the layouts it takes and gives (:meth:`Kind.layouts`): a *weighted* kind is given a split
  of its output by the plan (:class:`~hpctrain.layout.layout.Split`: a degree per axis, the
  1.5D modes among them); any other kind *follows* its first input's layout, and its other
  inputs are moved to what it asks for;
- whether a layout can run (:meth:`Kind.check`, naming the layer and the sizes);
- its local work for the cost model and for compute timing (:meth:`Kind.work`,
  :meth:`Kind.flops`, :meth:`Kind.kernels`: a kind is an
  :class:`~hpctrain.cost.work.Operation`, timed through the registry
  :data:`hpctrain.model.operations.OPERATIONS` with the optimizer's update and the input batch),
  the communication inside it (:meth:`Kind.comm_time`) and what it keeps and allocates
  (:meth:`Kind.memory`);
- how to build its distributed layer (:meth:`Kind.build`).

The parser, placement, the network, the cost model, compute timing, verify and checkpoints
iterate over the registry (:data:`hpctrain.model.kinds.KINDS`); none of them names a kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hpctrain.cost.collectives import gradient_sums_seconds
from hpctrain.cost.memory import Footprint
from hpctrain.cost.nodes import Group
from hpctrain.cost.work import LocalWork
from hpctrain.layout.layout import Layout, Split, largest_block
from hpctrain.layout.partition import SplitError
from hpctrain.model.options import Key, option_text, read_options

if TYPE_CHECKING:
    from hpctrain.cost.machine import Machine
    from hpctrain.layers.base import BuildContext, Layer

Shape = tuple[int, ...]
INPUT = "input"  # the name by which ``in=`` refers to the net's (or a block's) input


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a net: its name, kind, typed options and the names of its inputs; ``where``
    is the file and line that made it, for refusals found after parsing (none in equality)."""

    name: str
    kind: str
    options: Any
    inputs: tuple[str, ...] = ()
    where: str = field(default="", compare=False)


class Kind:
    """The default kind: one input, no weights, no communication, the layout it is fed."""

    name: ClassVar[str]
    keys: ClassVar[dict[str, Key]] = {}
    options: ClassVar[type] = type(None)
    weighted: ClassVar[bool] = False
    modes: ClassVar[tuple[str, ...]] = ()  # a weighted kind's modes besides batch
    grid_key: ClassVar[str] = ""  # the --grid key (conv=, fc=) of a weighted kind
    # the mode a --grid spec's layer runs in where its sizes cannot take the mode asked
    fallbacks: ClassVar[dict[str, str]] = {}
    many_inputs: ClassVar[bool] = False  # two or more inputs (add, concat)
    keeps_output: ClassVar[bool] = False  # the output array is kept for the backward
    pass_through: ClassVar[bool] = False  # the output is a view of the input
    # in evaluation (predict's forward pass alone): whether the layer still computes, and
    # whether its forward still communicates (batch norm normalises by its running statistics,
    # with no sum over ranks; dropout passes its input on)
    computes_in_evaluation: ClassVar[bool] = True
    communicates_in_evaluation: ClassVar[bool] = True

    # -- the net file ---------------------------------------------------------------------

    def parse(self, texts: dict[str, str], where: str) -> Any:
        """The typed options of a line's ``key=value`` texts (refused in one line)."""
        return self.options(**read_options(self.name, self.keys, texts, where))

    def option_texts(self, options: Any) -> dict[str, str]:
        """``key=value`` texts a net file gives for ``options``, which
        :meth:`~hpctrain.model.kinds.base.Kind.parse` reads back to equal options (keys whose
        value is None are left to their default)."""
        texts = {key: option_text(getattr(options, key)) for key in self.keys}
        return {key: text for key, text in texts.items() if text is not None}

    def resolve(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> LayerSpec:
        """The layer with its options made exact for inputs of per-sample ``shapes``: a window
        given once for every axis, one per axis of an image or a volume. Called when a net is
        made, before :meth:`out_shape`; a layer already resolved comes back the same."""
        return spec

    def resolve_in_net(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str,
                       net_input: Shape) -> LayerSpec:
        """:meth:`resolve`, for a kind whose options may name a size by the net's per-sample
        input shape ``net_input`` (a decoder's resize back to the input's size); what a net
        calls."""
        return self.resolve(spec, shapes, where)

    def out_shape(self, spec: LayerSpec, shapes: tuple[Shape, ...], where: str) -> Shape:
        """Per-sample output shape from the inputs' (refused, naming the layer, if unfit)."""
        return shapes[0]

    def param_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        """Whole shape of each parameter by suffix (``weight``, ``bias``, ``gamma`` …)."""
        return {}

    def buffer_shapes(self, spec: LayerSpec, shapes: tuple[Shape, ...]) -> dict[str, Shape]:
        """Whole shape of each buffer (state that is not trained, e.g. running statistics)."""
        return {}

    # -- layouts ----------------------------------------------------------------------------

    def layouts(self, spec: LayerSpec, fed: tuple[Layout, ...], out_shape: Shape,
                split: Split | None) -> tuple[tuple[Layout, ...], Layout]:
        """(input layouts, output layout) given the producers' layouts ``fed`` and, for a
        weighted kind, its split (a degree per axis of its output; None for the rest).
        ``out_shape`` includes the batch. Only the first input's layout may decide them (a
        weighted kind reads only shapes): the others are moved to what the kind asks, and the
        cost model passes them with their shapes alone."""
        return fed, fed[0].with_shape(out_shape)

    def check(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout) -> None:
        """Raise :class:`~hpctrain.layout.partition.SplitError` naming the layer and sizes when
        these layouts cannot run."""
        batch, pc = inputs[0].shape[0], inputs[0].grid[1]
        if batch < pc:
            raise SplitError(f"layer {spec.name}: batch {batch} cannot be split over {pc} batch "
                             f"ranks; raise --batch to at least {pc} or use a grid with fewer "
                             f"batch ranks")

    # -- cost -------------------------------------------------------------------------------

    def work(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
             need_dx: bool) -> LocalWork | None:
        """The busiest rank's kernel (None: nothing worth timing, e.g. a reshape)."""
        return LocalWork(self, largest_block(inputs[0]), need_dx=need_dx)

    def flops(self, work: LocalWork) -> tuple[float, float]:
        """Forward and backward floating-point operations of ``work`` (a multiply-add is 2)."""
        elements = float(math.prod(work.x))
        return elements, elements

    def kernels(self, xp: Any, work: LocalWork, dtype: Any, random: Callable[[Shape], Any]
                ) -> tuple[Callable[[], Any], Callable[[Any], Callable[[], Any]]]:
        """``forward()`` of ``work`` on data from ``random(shape)``, and ``backward_of(what
        forward returned)`` giving its ``backward()``, for compute timing."""
        return (lambda: None), (lambda _: lambda: None)

    def local_parameters(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout
                         ) -> int:
        """Parameter entries one rank holds (the busiest)."""
        return 0

    def gradient_group(self, inputs: tuple[Layout, ...], output: Layout) -> Group:
        """The ranks a parameter gradient is summed over."""
        return output.world

    def comm_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                  machine: Machine, itemsize: int, sums: float | None = None
                  ) -> tuple[float, float]:
        """Seconds of communication inside the layer (forward, backward), busiest rank: the
        parameter gradients' all-reduce by default, plus what the kind adds. ``sums``: the
        :meth:`gradient_sum_time` of these layouts where the caller has it already (the cost
        model prices it apart too), else found here."""
        return 0.0, self.gradient_sum_time(spec, inputs, output, machine, itemsize, sums)

    def gradient_sums(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                      itemsize: int) -> list[tuple[Group, float]]:
        """(ranks, bytes) of each sum of parameter gradients at the busiest rank: its shard,
        over the ranks that hold the same one."""
        params = self.local_parameters(spec, inputs, output)
        return [(self.gradient_group(inputs, output), params * itemsize)] if params else []

    def gradient_sum_time(self, spec: LayerSpec, inputs: tuple[Layout, ...], output: Layout,
                          machine: Machine, itemsize: int, known: float | None = None
                          ) -> float:
        """Seconds of the part of the backward's communication that sums parameter gradients
        (the network's, which ``--overlap`` puts in flight); part of :meth:`comm_time`.
        ``known``: these seconds, found before."""
        if known is not None:
            return known
        return gradient_sums_seconds(machine, self.gradient_sums(spec, inputs, output, itemsize))

    def keeps_input(self, spec: LayerSpec) -> bool:
        """Whether the layer keeps its input array for the backward."""
        return False

    def memory(self, spec: LayerSpec, fp: Footprint) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """(resident, transient) bytes of the layer beyond its parameters and kept input."""
        return {}, {}

    # -- verification -----------------------------------------------------------------------

    def magnitudes(self, spec: LayerSpec, xs: list[np.ndarray], dy: np.ndarray
                   ) -> dict[str, np.ndarray]:
        """Per parameter gradient and buffer (by suffix, e.g. ``bias``), the sum of the
        magnitudes of the terms it adds up, whole, from the layer's whole inputs ``xs`` and
        output gradient ``dy`` of one step from the initial state (NumPy).

        What ``verify`` measures each against: a sum computed in any order is off by at most
        about n·u·Σ|terms| (u the unit roundoff; Higham, *Accuracy and Stability of Numerical
        Algorithms*, §4.2), while its value can cancel to far below its terms — a bias feeding
        a batch norm has a gradient of zero in exact arithmetic. A kind without parameters or
        buffers has none.
        """
        return {}

    # -- running ----------------------------------------------------------------------------

    def build(self, spec: LayerSpec, ctx: BuildContext) -> Layer:
        raise NotImplementedError
