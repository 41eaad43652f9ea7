"""What every distributed layer has: layouts in and out, parameters, forward and backward."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpctrain.device.backend import Backend
from hpctrain.kernels.counter_rng import stream_key, uniform_block
from hpctrain.layout.layout import CHANNEL_AXIS, REPLICAS, Box, Layout
from hpctrain.layout.partition import block_range
from hpctrain.layout.reduction import InputSplit

if TYPE_CHECKING:
    from hpctrain.comm.grid import GridSet  # imports MPI: planning builds no layer

INIT_STREAM = 1


@dataclass
class Parameter:
    """One rank's shard of a logical parameter tensor, with its gradient.

    ``sharded_by`` is the layout whose channel (or feature) blocks cut axis 0 (the output
    channels): the rank holds the block of axis 0 it holds of that layout's channels. None, or
    a layout that does not cut its channels: every rank holds the whole tensor. ``layout``, when
    given, is the parameter's own layout instead (a weight cut along its input channels too:
    :class:`~hpctrain.layout.reduction.InputSplit`). The gradient is summed over the ranks
    holding the same shard before the optimizer sees it, so every replica takes the same step.

    Under a mixed precision (bf16, fp16: :mod:`hpctrain.device.precision`) ``value`` is the
    16-bit copy the kernels read and ``master`` the float32 weights the optimizer updates and
    checkpoints keep; ``grad`` is 16-bit, as it is made and summed. Otherwise ``master`` is
    None and ``value`` is both.
    """

    name: str
    value: Any
    shape: tuple[int, ...]
    sharded_by: Layout | None = None
    grad: Any = None
    kept_grad: Any = field(default=None, repr=False)
    layout: Layout | None = None
    master: Any = field(default=None, repr=False)

    @property
    def weights(self) -> Any:
        """The parameter at full precision (the master weights, or the value itself)."""
        return self.value if self.master is None else self.master

    def set_weights(self, a: Any) -> None:
        """Overwrite the parameter (master and the kernels' copy) with ``a``, in place."""
        if self.master is not None:
            self.master[...] = a
        self.value[...] = a

    def grad_buffer(self, xp: Any) -> Any:
        """An array of the value's shape that this parameter keeps for its gradient to be
        written into (``out=``), made on first use.

        A gradient made afresh every step costs fresh pages each time (the page faults of
        AlexNet's fc7 gradient, 67 MB, took longer than the GEMM that fills it) and, while the
        previous step's gradient is still referenced, a second copy. A gradient lives only for
        its step (summed, then the optimizer's scratch), so one kept array serves every step.
        """
        if self.kept_grad is None:
            self.kept_grad = xp.empty_like(self.value)
        return self.kept_grad

    def box(self, rank: int) -> Box:
        if self.layout is not None:
            return self.layout.box(rank)
        by = self.sharded_by
        if by is not None and not by.holds(rank):  # a layer on a group: nothing outside it
            return tuple((0, 0) for _ in self.shape)
        box = [(0, n) for n in self.shape]
        if by is not None and by.parts[CHANNEL_AXIS] > 1:
            box[0] = block_range(self.shape[0], by.parts[CHANNEL_AXIS],
                                 by.block_index(rank, CHANNEL_AXIS))
        return tuple(box)

    def holds_first_copy(self, rank: int) -> bool:
        """Whether ``rank`` is the lowest rank holding its block of this tensor: summed over
        the ranks, what the first copies hold counts every entry exactly once (a norm over
        the shards, never once per replica). A checkpoint gathers each block from the same
        rank.

        O(digits of the mesh), not a loop over the ranks. Exact because a rank's block is
        fixed by its coordinates on the mesh digits that cut the tensor (its own ``layout``:
        every digit but the replicas'; ``sharded_by``: the digits of the channels, which cut
        axis 0), and distinct coordinates there give distinct blocks; the ranks holding the
        same block differ only on the other digits, and the lowest of them (ranks are the
        coordinates in mixed radix) has 0 on each. A rank outside the layout's group holds
        nothing. E.g. a weight cut over Pr = 2 on a 2×3 grid (mesh (3, 2) cutting the batch,
        then the channels): ranks 0 and 1 hold the first copies of the two halves; ranks 2..5
        (batch coordinate 1 or 2) replicas.
        """
        layout = self.layout if self.layout is not None else self.sharded_by
        if layout is None:  # every rank holds the whole tensor
            return rank == 0
        if not layout.holds(rank):
            return False
        if self.layout is not None:
            return all(c == 0 for c, axis in zip(layout.coordinates(rank), layout.axes,
                                                 strict=True) if axis == REPLICAS)
        return all(c == 0 for c, axis in zip(layout.coordinates(rank), layout.axes,
                                             strict=True) if axis != CHANNEL_AXIS)


def init_parameter(backend: Backend, name: str, shape: tuple[int, ...],
                   sharded_by: Layout | None, rank: int, key: int, bound: float,
                   layout: Layout | None = None) -> Parameter:
    """Uniform(-bound, bound) entries drawn by global index: the same values on every grid.

    Drawn at the master precision; under a mixed one the kernels' copy is rounded from it."""
    param = Parameter(name, None, shape, sharded_by, layout=layout)
    precision = backend.precision
    u = uniform_block(backend.xp, stream_key(key, INIT_STREAM), shape, param.box(rank),
                      precision.master)
    param.value = (u * 2 - 1) * precision.master(bound)
    if precision.mixed:
        param.master, param.value = param.value, param.value.astype(precision.storage)
    return param


def weight_and_bias(backend: Backend, name: str, weight_shape: tuple[int, ...], bias: bool,
                    sharded_by: Layout | None, rank: int, key: int,
                    split: InputSplit | None = None) -> tuple[Parameter, Parameter | None]:
    """A layer's weight, and its bias when asked, both U(±1/√fan_in) (the common default).

    The output axis (axis 0) is cut as ``sharded_by`` cuts its channels; fan_in is the rest of
    the weight. Under an input split both are cut as its ``weight`` and ``bias`` layouts say.
    """
    fan_in = math.prod(weight_shape[1:])
    bound = 1.0 / math.sqrt(fan_in)
    weight = init_parameter(backend, f"{name}.weight", weight_shape, sharded_by, rank,
                            stream_key(key, 0), bound, split and split.weight)
    if not bias:
        return weight, None
    return weight, init_parameter(backend, f"{name}.bias", weight_shape[:1], sharded_by, rank,
                                  stream_key(key, 1), bound, split and split.bias)


@dataclass
class BuildContext:
    """What building a layer needs: its plan entry (mode and grid), its layouts, the grids and
    where it runs. A layer kind builds its layer from this (:meth:`Kind.build
    <hpctrain.model.kinds.base.Kind.build>`)."""

    mode: str
    grid: tuple[int, int]
    inputs: tuple[Layout, ...]
    output: Layout
    grids: GridSet
    backend: Backend
    key: int  # the layer's random stream (initial weights, dropout masks)
    rank: int


class Layer:
    """A layer running on a layout: ``forward(x, step) -> y`` and ``backward(dy) -> dx``.

    The contract:

    - ``in_layout`` is the layout the layer needs its (first) input in, ``in_layouts`` those of
      all its inputs; the network redistributes each producer's output into them.
      ``out_layout`` is where Y lies.
    - A layer of several inputs (add, concat) takes a list of arrays in ``forward`` and returns
      a list of input gradients from ``backward``.
    - ``forward`` saves on the layer what its ``backward`` needs (one step at a time: each
      forward replaces it); ``backward`` leaves each parameter's gradient in ``Parameter.grad``
      and never writes into ``dy``, which other layers may share. Where ranks of ``grad_comm``
      hold the same shard, that gradient is this rank's part of the sum over them; the network
      sums it (:mod:`hpctrain.comm.gradients`), in flight while the backward goes on.
      ``grad_comm`` None: the gradients are whole.
    - Set from outside: ``need_dx`` (False when nobody reads the input gradient: then
      ``backward`` may return None) and ``training`` (dropout on, batch statistics; False for
      evaluation).
    - ``params`` are trained by the optimizer; ``buffers`` are state that is not (batch norm's
      running statistics), saved in checkpoints with the parameters.
    """

    name: str
    mode: str
    in_layout: Layout
    out_layout: Layout
    params: list[Parameter]
    buffers: list[Parameter] = []  # noqa: RUF012 - read-only default, replaced per layer
    grad_comm: Any = None
    need_dx: bool = True
    training: bool = True

    @property
    def in_layouts(self) -> tuple[Layout, ...]:
        return (self.in_layout,)

    def gradient_groups(self) -> list[tuple[Any, list[Parameter]]]:
        """(communicator, parameters) of each group of gradients summed over the same ranks:
        all of them over ``grad_comm`` unless the layer says otherwise."""
        return [(self.grad_comm, self.params)] if self.params else []

    def settle(self) -> None:
        """Make the buffers every rank holds agree before anything reads them (batch norm's
        running statistics over groups of samples); collective over the layer's ranks."""

    def forward(self, x: Any, step: int) -> Any:
        raise NotImplementedError

    def backward(self, dy: Any) -> Any:
        raise NotImplementedError


class Join(Layer):
    """A layer of several inputs and no weights (add, concat), on the layout of its first input:
    every input is moved to its layout in ``inputs`` before ``forward``."""

    mode = "follow"

    def __init__(self, name: str, ctx: BuildContext) -> None:
        self.name, self.backend, self.params = name, ctx.backend, []
        self.inputs, self.out_layout = ctx.inputs, ctx.output
        self.in_layout = ctx.inputs[0]

    @property
    def in_layouts(self) -> tuple[Layout, ...]:
        return self.inputs


class Absent(Layer):
    """A layer that runs on a group of ranks this rank is not in: it is never run, and it holds
    an empty block of each of the layer's parameters and buffers, by the same names in the same
    order as the ranks that run it, so that every rank lists the same tensors for a gather, a
    checkpoint or the optimizer (whose update of an empty block does nothing)."""

    mode = "follow"

    def __init__(self, name: str, inputs: tuple[Layout, ...], output: Layout,
                 params: dict[str, tuple[int, ...]], buffers: dict[str, tuple[int, ...]],
                 backend: Backend) -> None:
        self.name, self.inputs, self.in_layout, self.out_layout = name, inputs, inputs[0], output
        xp, precision = backend.xp, backend.precision
        # a weight cut along its input channels has a layout of its own, as the layer makes it:
        # every rank must find the same blocks of it on the others
        split = (InputSplit.of(inputs[0], output, params["weight"]) if "weight" in params
                 else None)
        own = {"weight": split.weight, "bias": split.bias} if split is not None else {}

        def empty(suffix: str, shape: tuple[int, ...], dtype: Any) -> Parameter:
            value = xp.zeros((0,) * len(shape), dtype=dtype)
            return Parameter(f"{name}.{suffix}", value, shape, output, grad=value,
                             layout=own.get(suffix))

        self.params = [empty(s, shape, precision.master) for s, shape in params.items()]
        self.buffers = [empty(s, shape, precision.master) for s, shape in buffers.items()]

    @property
    def in_layouts(self) -> tuple[Layout, ...]:
        return self.inputs

    def gradient_groups(self) -> list[tuple[Any, list[Parameter]]]:
        return []
