"""Predicted time of every layer under every candidate (mode, Pr×Pc), as the code executes it,
and its memory per rank.

The net is cut into *segments* (:mod:`hpctrain.plan.segments`): a weighted layer, whose mode
and grid are chosen, and the layers without weights that follow it on its layout. A segment's
cost depends on its own choice only; a redistribution between segments (into a weighted layer,
or into an add's or concat's other inputs) depends on the choices at both ends. In a chain
those are consecutive segments. Per layer the model counts, forward and backward:

- compute: the local kernels at the largest local block, measured or from a FLOP rate, and the
  optimizer's update of the layer's weight shard (counted in the backward);
- communication inside the layer, as its kind says
  (:meth:`hpctrain.model.kinds.base.Kind.comm_time`): ΔW all-reduced over Pc (over all P in
  domain mode, where W is replicated everywhere), halo rows exchanged with both neighbours
  (domain conv and pooling), batch norm's statistics;
- the bytes of every message and buffer by the run's precision
  (:mod:`hpctrain.device.precision`): activations, their moves and halos, partial sums,
  parameter gradients and their sums in the storage dtype (2 bytes under bf16 and fp16, so a
  bucket of ``bucket_bytes`` holds twice as many gradients); master weights, momentum and the
  optimizer's scratch in the master dtype (float32);
- redistribution into the layer, priced by the move's own method
  (:func:`hpctrain.layout.moves.move_between`), the one the code runs: all-gather forward and
  its adjoint reduce-scatter backward when a model group's blocks tile the needed block, nothing
  when every rank already holds what it needs, else point-to-point messages with the peers that
  share data, costed at the busiest receiver (the same in both directions).

The model-parallel all-gather is always deferred to the first layer that needs every channel:
ReLU, dropout and pooling act per channel and never grow the tensor, so deferring never costs
more. The backward of an all-gather is costed as the reduce-scatter the code runs (its exact
adjoint, half the bytes of the all-reduce the paper counts).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from hpctrain.cost.collectives import bucket_latency, gradient_sums_seconds
from hpctrain.cost.compute import (
    FlopModel,
    MeasuredCompute,
    code_version,
    default_cache_path,
    timing_context,
)
from hpctrain.cost.machine import Machine, local_profile
from hpctrain.cost.memory import (
    RANDOM_BYTES,
    Footprint,
    larger,
    parameter_bytes,
    precision_of,
)
from hpctrain.cost.work import LocalWork
from hpctrain.device.precision import PRECISIONS, Precision
from hpctrain.errors import UserError
from hpctrain.layout.layout import Layout, largest_block
from hpctrain.layout.moves import (
    METHODS,
    AllGatherMove,
    GeneralMove,
    IdentityMove,
    Move,
    general_seconds_in_closed_form,
    methods_between,
    move_between,
)
from hpctrain.model.kinds import KINDS, compute_factors_for, shape_class
from hpctrain.model.net import NetSpec
from hpctrain.model.operations import INPUT, PIXEL_LOSS, TIMED_MODULES, UPDATE
from hpctrain.plan.buckets import slowest_latency
from hpctrain.plan.placement import LayerLayouts, loss_layout
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.segments import Segments

if TYPE_CHECKING:
    from hpctrain.device.backend import Backend
    from hpctrain.device.threads import ThreadChoice


@dataclass(eq=False)
class LayerCost:
    """Predicted seconds (forward, backward) of one layer, and its memory per rank in bytes.

    ``resident``: what the layer keeps through a whole step (its parameter shards with their
    gradients, momentum and scratch, and what its forward saves for the backward), by name.
    ``transient``: what it allocates on top for a moment, at the larger of its forward and its
    backward (or of the redistribution feeding it), by name. Transients of different layers never
    overlap, so a plan's peak is every resident byte plus its largest transient. (A tensor read
    by several layers outlives its producer: its output and its summed gradient are counted as
    resident, an upper bound on the time they are held.)

    Both are found when first read (``memory_of``, a function giving them): a search with no
    memory cap weighs thousands of candidates by their time alone, and reads the memory of the
    plan it finds.
    """

    layer: str
    kind: str
    mode: str
    grid: tuple[int, int]
    compute: tuple[float, float] = (0.0, 0.0)
    comm: tuple[float, float] = (0.0, 0.0)
    redistribution: tuple[float, float] = (0.0, 0.0)
    move: type[Move] = IdentityMove  # the method of the move feeding it (a table's "fed by")
    work: LocalWork | None = field(default=None, repr=False)
    update: LocalWork | None = field(default=None, repr=False)  # the optimizer, with backward
    grad_sum: float = 0.0  # seconds of comm[1] that sum parameter gradients (may be in flight)
    # one all-reduce's latency on the slowest communicator those sums use: what the layer's
    # last bucket may cost the step (hpctrain.plan.buckets)
    bucket_latency: float = 0.0
    # (resident, transient), or a function that gives them when first read
    memory_of: tuple[dict[str, float], dict[str, float]] | Callable[
        [], tuple[dict[str, float], dict[str, float]]] = field(
        default_factory=lambda: ({}, {}), repr=False)

    def memory_found(self) -> tuple[dict[str, float], dict[str, float]]:
        """(resident, transient), found now if they were not."""
        if callable(self.memory_of):
            self.memory_of = self.memory_of()
        return self.memory_of

    @property
    def resident(self) -> dict[str, float]:
        return self.memory_found()[0]

    @resident.setter
    def resident(self, value: dict[str, float]) -> None:
        self.memory_of = (value, self.memory_found()[1])

    @property
    def transient(self) -> dict[str, float]:
        return self.memory_found()[1]

    @transient.setter
    def transient(self, value: dict[str, float]) -> None:
        self.memory_of = (self.memory_found()[0], value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LayerCost):
            return NotImplemented
        return self._compared() == other._compared()

    def _compared(self) -> tuple:
        return (*(getattr(self, f.name) for f in fields(self) if f.name != "memory_of"),
                self.resident, self.transient)

    def __getstate__(self) -> dict:
        self.memory_found()  # a function is not pickled: its tables are
        return self.__dict__

    def for_layer(self, layer: str) -> LayerCost:
        """A copy for ``layer``, priced alike, with memory tables of its own to amend (or the
        function that makes them anew)."""
        twin = object.__new__(LayerCost)  # a shallow copy: copy.copy takes three times longer
        twin.__dict__.update(self.__dict__)
        twin.layer = layer
        if callable(self.memory_of):  # found once, here, when the first twin asks
            twin.memory_of = lambda: tuple(dict(table) for table in self.memory_found())
        else:
            twin.memory_of = (dict(self.resident), dict(self.transient))
        return twin

    @property
    def total(self) -> float:
        # sum() of each pair, spelled out: the same floats (0.0 + x as sum's 0 + x; of two
        # terms, the compensated sum of Python 3.12 on is the plain one), at half the cost
        (f, b), (cf, cb), (rf, rb) = self.compute, self.comm, self.redistribution
        return (0.0 + f + b) + (0.0 + cf + cb) + (0.0 + rf + rb)

    @property
    def memory(self) -> float:
        """Bytes kept through the step."""
        return sum(self.resident.values())

    @property
    def peak(self) -> float:
        """Bytes allocated for a moment on top of what every layer keeps."""
        return sum(self.transient.values())


@dataclass
class SegmentCost:
    """The layers of a segment (in the order of its entry in ``segments`` of
    :class:`~hpctrain.plan.segments.Segments`) and their layouts; ``timed``: whether their
    compute is filled in."""

    layers: list[LayerCost]
    layouts: list[LayerLayouts]
    timed: bool = False
    # its time with each share of the gradient sums counted free, once timed (a search weighs
    # every candidate again at each of its rounds)
    _weighed: dict[float, float] = field(default_factory=dict, repr=False, compare=False)

    def time_with_free(self, free: float) -> float:
        """Its time with ``free`` of each gradient sum counted free (0: its time), as a search
        weighs it."""
        found = self._weighed.get(free)
        if found is None:
            found = time_with_free(self.layers, free)
            if self.timed:  # compute filled in: what it is for good
                self._weighed[free] = found
        return found

    @cached_property
    def slowest_latency(self) -> float:
        """One all-reduce's latency on the slowest communicator its layers sum gradients
        over (:func:`~hpctrain.plan.buckets.slowest_latency`): each round of the last buckets
        asks it of every candidate."""
        return slowest_latency(self.layers)

    @property
    def in_layout(self) -> Layout:
        return self.layouts[0].input

    @property
    def out_layout(self) -> Layout:
        """The output of the segment's last layer (in a chain, what the next one reads)."""
        return self.layouts[-1].output

    @property
    def total(self) -> float:
        return sum(layer.total for layer in self.layers)

    @property
    def memory(self) -> float:
        return sum(layer.memory for layer in self.layers)

    @property
    def peak(self) -> float:
        return max(layer.peak for layer in self.layers)


class CostModel(Segments):
    """Per-segment costs of ``net`` at global batch ``batch`` on ``procs`` ranks: its time and
    its memory per rank, layer by layer, under each candidate of each segment (the segments and
    their layouts: :class:`~hpctrain.plan.segments.Segments`).

    Parameters
    ----------
    machine : α–β constants (see :mod:`hpctrain.cost.machine`).
    compute : an object with ``times(works) -> {work: (forward s, backward s)}``.
    precision : the run's :class:`~hpctrain.device.precision.Precision` (fp32 when left
        out): the bytes of activations, messages and gradients (its storage dtype) and of
        master weights and optimizer state (its master dtype). A number of bytes per value
        (what a run log without a precision gives) is read by
        :func:`~hpctrain.cost.memory.precision_of`.
    overlap : the run puts gradient sums in flight (``--overlap``).
    inference : the forward pass alone, as ``predict`` runs it: no backward, no gradient or
        optimizer state, nothing kept for a backward (what a layer keeps for it is counted as
        allocated for a moment instead), so a plan is chosen for the forward's time and memory.
    optimizer : the run's ``--optimizer``, whose state every parameter keeps
        (:data:`~hpctrain.cost.memory.OPTIMIZER_STATE`: one array for SGD and LARS, two for
        AdamW and LAMB).
    accumulate : the run's micro-batches per step (``--accumulate``): ``batch`` is then the
        micro-batch, and above 1 every parameter also keeps the sum of its gradients.
    """

    def __init__(self, net: NetSpec, batch: int, procs: int, machine: Machine, compute,
                 precision: Precision = PRECISIONS["fp32"], overlap: bool = False,
                 inference: bool = False, optimizer: str = "sgd", accumulate: int = 1) -> None:
        super().__init__(net, batch, procs)
        self.machine, self.compute, self.overlap = machine, compute, overlap
        self.inference, self.optimizer, self.accumulate = inference, optimizer, accumulate
        self.precision = precision_of(precision)
        # the share of the gradient sums' time that can hide behind the backward: the
        # machine's, when the run puts them in flight (--overlap); none otherwise
        self.hidden_share = machine.overlap if overlap else 0.0
        self._segments: dict[tuple[int, LayerPlan], SegmentCost] = {}
        self._moves: dict[tuple[Layout, Layout], tuple[Move, float, float]] = {}
        self._priced: dict[tuple, LayerCost] = {}  # by (number alike, mode, layouts, fed)
        # the planner's prices of moves between the layouts of one shape, filled in as it asks
        # (:func:`hpctrain.plan.planner._move_grid`): their seconds, by shape (read back by
        # move_cost), and with the memory of each layer's, by shape and layer
        self.move_prices: dict[tuple[int, ...], MovePrices] = {}
        self.move_grids: dict[tuple, object] = {}
        # per region on groups, what its layers and its branches cost under each choice
        # (:class:`hpctrain.plan.grouped.RegionPrices`), the same in every search
        self.region_layers: dict[object, dict] = {}
        # the exact searches' tables of a net with branches, per (weighed, share counted
        # free): each set of choices they were made for (:func:`hpctrain.plan.planner._plan_tables`)
        self.search_tables: dict[tuple[bool, float], list] = {}
        # and with regions on groups, per the latency every communicator stays below: each
        # set of choices and of values on groups they were made for, with any share counted
        # free (:func:`hpctrain.plan.planner._plan_tables`)
        self.grouped_tables: dict[float, list] = {}

    def timed_by(self, compute) -> CostModel:
        """The same model (net, batch, ranks, profile, precision, overlap) with its compute
        times from ``compute``: a plan priced again under kernels timed at another moment."""
        return CostModel(self.net, self.batch, self.procs, self.machine, compute,
                         self.precision, self.overlap, self.inference, self.optimizer,
                         self.accumulate)

    @property
    def itemsize(self) -> int:
        """The bytes of one stored value (an activation, a weight the kernels use, a gradient,
        an entry of any message but batch norm's statistics)."""
        return self.precision.itemsize

    def move_cost(self, src: Layout, dst: Layout) -> tuple[Move, float, float]:
        """(the move, forward s, backward s) of redistributing ``src`` into ``dst``. Made once
        per pair: the planner prices the same moves (from a segment's output under each of its
        choices into each choice of the next) many times over."""
        cost = self._moves.get((src, dst))
        if cost is None:
            prices = self.move_prices.get(src.shape)
            found = None if prices is None else prices.found(src, dst)
            if found is not None:  # priced with its table's others: the same floats
                method, forward, backward = found
                cost = self._moves[src, dst] = (METHODS[method](src, dst), forward, backward)
            else:
                move = move_between(src, dst)
                cost = self._keep_move((src, dst), move,
                                       *move.seconds(self.machine, self.itemsize))
        return cost

    def price_moves(self, pairs: Iterable[tuple[Layout, Layout]]
                    ) -> list[tuple[Move, float, float]]:
        """:meth:`move_cost` of every move (source, target) in ``pairs`` made at once, a shape at
        a time (:meth:`move_arrays`: the same floats). A search asks for thousands of moves of a
        segment at a time, and a region on groups for the moves of all its branches. Returns
        the cost of each distinct pair, in the order each first came: where ``pairs`` are
        distinct, that of ``pairs``, with no second look-up."""
        # each pair hashed as few times as may be: hashing a layout runs Python code, and a
        # search prices tens of thousands of moves
        known = self._moves
        costs: list = []  # each distinct pair's, filled in below where it is new
        new: dict[tuple[int, ...], list[tuple[int, tuple[Layout, Layout]]]] = {}  # by shape
        for pair in dict.fromkeys(pairs):
            cost = known.get(pair)
            if cost is None:
                new.setdefault(pair[0].shape, []).append((len(costs), pair))
            costs.append(cost)
        for moves in new.values():
            rows: dict[Layout, int] = {}  # each distinct source and target, in first order
            cols: dict[Layout, int] = {}
            si = np.array([rows.setdefault(src, len(rows)) for _, (src, _) in moves],
                          dtype=np.int64)
            di = np.array([cols.setdefault(dst, len(cols)) for _, (_, dst) in moves],
                          dtype=np.int64)
            methods, forward, backward = self.move_arrays(list(rows), list(cols), si, di)
            for (at, pair), method, f, b in zip(moves, methods.tolist(), forward.tolist(),
                                                backward.tolist(), strict=True):
                costs[at] = known[pair] = (METHODS[method](*pair), f, b)
        return costs

    def move_arrays(self, srcs: list[Layout | None], dsts: list[Layout | None],
                    si: np.ndarray, di: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(method, forward s, backward s) of each move ``srcs[si[m]]`` → ``dsts[di[m]]``
        (layouts of one shape; a None is never indexed), as :meth:`move_cost` prices it, every
        pair at once and no :class:`~hpctrain.layout.moves.Move` made: its method's place in
        :data:`~hpctrain.layout.moves.METHODS` (:func:`~hpctrain.layout.moves.methods_between`),
        a general move's seconds in closed form where it has one
        (:func:`~hpctrain.layout.moves.general_seconds_in_closed_form`: the same floats), the
        others' one by one."""
        methods = methods_between(srcs, dsts, si, di)
        forward, backward = np.zeros(len(si)), np.zeros(len(si))
        general = np.flatnonzero(methods == _GENERAL)
        if len(general):
            rows, at_rows = _compacted(si[general], len(srcs))
            cols, at_cols = _compacted(di[general], len(dsts))
            seconds = general_seconds_in_closed_form(
                [srcs[i] for i in rows], [dsts[j] for j in cols], at_rows, at_cols,
                self.machine, self.itemsize)
            forward[general] = backward[general] = seconds  # the same both ways
        alone = np.flatnonzero((methods == _ALLGATHER) | np.isnan(forward))
        for m in alone.tolist():  # NaN: no closed form
            move = METHODS[methods[m]](srcs[si[m]], dsts[di[m]])
            forward[m], backward[m] = move.seconds(self.machine, self.itemsize)
        if self.inference:  # no backward
            backward[:] = 0.0
        return methods, forward, backward

    def _keep_move(self, pair: tuple[Layout, Layout], move: Move, forward: float,
                   backward: float) -> tuple[Move, float, float]:
        """Keep the price of ``move`` between the layouts ``pair`` for :meth:`move_cost`: no
        backward in inference."""
        cost = self._moves[pair] = (move, forward, 0.0 if self.inference else backward)
        return cost

    def _memory(self, index: int, layouts: LayerLayouts, work: LocalWork | None, params: int,
                fresh_input: bool) -> tuple[dict[str, float], dict[str, float]]:
        """(resident, transient) bytes of layer ``index`` on the busiest rank, by name.

        What the code keeps, read from the layers and kernels (each kind's
        :meth:`~hpctrain.model.kinds.base.Kind.memory`), plus what every layer with parameters
        keeps: its shards with gradient, momentum and the optimizer's scratch. Between steps every
        layer still holds the previous step's arrays, so a forward allocates what it keeps a
        second time before the old copy goes. ``fresh_input``: a move (not the identity) made
        the input array.
        """
        spec, b = self.net.layers[index], self.itemsize
        x = math.prod(largest_block(layouts.input)) * b
        y = math.prod(largest_block(layouts.output)) * b
        if self.inference:
            return self._forward_memory(index, layouts, work, params, x, y)
        kept_before = self.kept_upstream(index) and not fresh_input
        resident = (parameter_bytes(params, self.precision, self.optimizer, self.accumulate)
                    if params else {})
        if self.keeps_input(index) and not kept_before:
            resident["input"] = x
        footprint = Footprint(x, y, work, b, {} if kept_before else {"input": x},
                              bool(layouts.input.spatial_cuts))
        kept, transient = KINDS[spec.kind].memory(spec, footprint)
        if len(self.net.consumers.get(index, ())) > 1:
            # a fork (a residual block's input, an Inception module's): the output lives until
            # its last reader has run, and its gradient is summed while the branches go back
            if not KINDS[spec.kind].keeps_output and "output" not in kept:
                kept["output held for its other readers"] = y
            kept["gradient summed from its readers"] = y
        return {**resident, **kept}, transient

    def _forward_memory(self, index: int, layouts: LayerLayouts, work: LocalWork | None,
                        params: int, x: float, y: float
                        ) -> tuple[dict[str, float], dict[str, float]]:
        """(resident, transient) bytes of layer ``index`` in a forward pass alone: its weights
        and a fork's output, kept; its input, its output, what its forward allocates and what
        a training step would keep of it for the backward, for a moment (a forward keeps
        nothing for a backward, and frees each output once its readers have run)."""
        spec = self.net.layers[index]
        resident = {"parameters": params * self.itemsize} if params else {}
        footprint = Footprint(x, y, work, self.itemsize, {"input": x},
                              bool(layouts.input.spatial_cuts), forward_only=True)
        kept, transient = KINDS[spec.kind].memory(spec, footprint)
        if len(self.net.consumers.get(index, ())) > 1:
            resident["output held for its other readers"] = y
        return resident, {**kept, **transient, "output": y}

    def move_memory(self, src: Layout, dst: Layout, index: int
                    ) -> tuple[dict[str, float], dict[str, float]]:
        """(resident, transient) bytes of moving ``src`` into ``dst`` for layer ``index``, on
        top of what the layer's own estimate counts (which assumes no move): the new array when
        the layer keeps it, and the buffers of the move (forward: a contiguous copy of the
        block, the receive buffer, the result; backward the same for the gradient)."""
        move = self.move_cost(src, dst)[0]
        if not move.moves_data:
            return {}, {}
        d = math.prod(largest_block(dst)) * self.itemsize
        resident = ({"moved input": d} if self.keeps_input(index) and self.kept_upstream(index)
                    and not self.inference else {})
        return resident, {"redistribution buffers": move.buffer_bytes(self.itemsize)}

    def data_memory(self, first_in: Layout) -> tuple[dict[str, float], dict[str, float]]:
        """The input batch block, kept through the step, and the RNG drawing it."""
        entries = math.prod(largest_block(first_in))
        return {"input batch": entries * self.itemsize}, {"random numbers":
                                                          entries * RANDOM_BYTES}

    def segment_cost(self, segment: int, choice: LayerPlan, timed: bool = True) -> SegmentCost:
        """Every layer of the segment under ``choice``, without the moves into the segment;
        ``timed`` False: its kernels need not be timed (compute may be left at zero), memory
        and moves only. Made once; timing fills the same object in."""
        found = self._segments.get((segment, choice))
        if found is None:
            found = self._segments[segment, choice] = self._segment_untimed(segment, choice)
        if timed and not found.timed:
            self._fill_compute(found.layers)
            found.timed = True
        return found

    def time_layers(self, costs: list[LayerCost]) -> None:
        """Fill in the compute of ``costs`` (layer costs made untimed, e.g. by
        :meth:`layer_cost`), their kernels timed in one batch."""
        self._fill_compute(costs)

    def _fill_compute(self, costs: list[LayerCost],
                      times: dict[LocalWork, tuple[float, float]] | None = None) -> None:
        """Each layer's compute: its kernels' times (from ``times`` when they are known),
        plus the optimizer's in the backward, times the profile's factor for its shape class
        (a convolution's window: :func:`~hpctrain.model.kinds.shape_class`), else its kind,
        else its class of kinds (:func:`~hpctrain.model.kinds.compute_factors`), fitted to
        work of its size: within a rank's share of the cache or beyond it."""
        if times is None:
            times = self.compute.times(_distinct(works_of(costs)))
        for cost in costs:
            if cost.work is not None:
                cost.compute = (times[cost.work][0], 0.0) if self.inference else times[cost.work]
            if cost.update is not None:
                cost.compute = (cost.compute[0], cost.compute[1] + sum(times[cost.update]))
            if self.machine.compute_scale:  # fitted to training steps of this machine
                touched = cost.work.touched_elements() * self.itemsize if cost.work else 0
                key = shape_class(cost.kind, *((cost.work.kernel, cost.work.groups)
                                                 if cost.work else ()))
                scale = compute_factors_for(self.machine.compute_scale, key, touched,
                                            self.machine.cache_bytes)
                cost.compute = (cost.compute[0] * scale[0], cost.compute[1] * scale[1])

    def layer_cost(self, index: int, mode: str, layouts: LayerLayouts,
                   fed: Layout | None) -> LayerCost:
        """Layer ``index`` on ``layouts``, fed its first input from ``fed`` (None: counted
        elsewhere, by whoever knows the producer's layout), untimed. Priced once for all
        layers alike on equal layouts."""
        key = (self._alike_layer[index], mode, layouts, fed)
        priced = self._priced.get(key)
        if priced is None:
            priced = self._priced[key] = self._price_layer(index, mode, layouts, fed)
        return priced.for_layer(self.net.layers[index].name)

    def _price_layer(self, index: int, mode: str, layouts: LayerLayouts,
                     fed: Layout | None) -> LayerCost:
        spec = self.net.layers[index]
        kind = KINDS[spec.kind]
        cost = LayerCost(spec.name, spec.kind, mode, layouts.output.grid)
        if fed is not None:  # e.g. flatten gathers height-split rows
            move, *moved = self.move_cost(fed, layouts.input)
            cost.move, cost.redistribution = type(move), tuple(moved)
        cost.work = kind.work(spec, layouts.inputs, layouts.output, self.net.reads_layers(index))
        sums = kind.gradient_sums(spec, layouts.inputs, layouts.output, self.itemsize)
        cost.grad_sum = gradient_sums_seconds(self.machine, sums)  # gradient_sum_time's
        cost.comm = kind.comm_time(spec, layouts.inputs, layouts.output, self.machine,
                                   self.itemsize, cost.grad_sum)
        cost.bucket_latency = max((bucket_latency(self.machine, group) for group, _ in sums),
                                  default=0.0)
        params = kind.local_parameters(spec, layouts.inputs, layouts.output)
        if self.inference:  # no backward: no gradient sums, no update
            forward = cost.comm[0] if kind.communicates_in_evaluation else 0.0
            cost.comm, cost.grad_sum, cost.bucket_latency = (forward, 0.0), 0.0, 0.0
            if not kind.computes_in_evaluation:
                cost.work = None
        elif params:
            cost.update = LocalWork(UPDATE, (params,))
        work, fresh = cost.work, cost.move.moves_data
        model = weakref.ref(self)  # the model itself: a cycle through its own prices

        def memory() -> tuple[dict[str, float], dict[str, float]]:
            found = model()
            if found is None:
                raise RuntimeError(f"the memory of layer {spec.name} was asked for after its "
                                   f"cost model was freed")
            resident, transient = found._memory(index, layouts, work, params, fresh)
            if fresh:
                transient = larger(transient, found.move_memory(fed, layouts.input, index)[1])
            return resident, transient

        cost.memory_of = memory
        return cost

    def _segment_untimed(self, segment: int, choice: LayerPlan) -> SegmentCost:
        layouts = self.runnable_layouts(segment, choice)
        where = dict(zip(self.segments[segment], layouts, strict=True))
        costs = []
        for k, layer in where.items():
            first = self.net.producers(k)[0]
            fed = where[first].output if first in where and first != k else None
            mode = choice.mode if k == self.heads[segment] else "follow"
            costs.append(self.layer_cost(k, mode, layer, fed))
        return SegmentCost(costs, layouts)

    def input_cost(self, first_in: Layout, timed: bool = True) -> LayerCost:
        """Producing each rank's block of the input batch (synthetic data here), per step."""
        work = LocalWork(INPUT, largest_block(first_in))
        cost = LayerCost("input", "data", "follow", first_in.grid, work=work)
        cost.resident, cost.transient = self.data_memory(first_in)
        if timed:
            cost.compute = self.compute.times([work])[work]
        return cost

    def loss_cost(self, last_out: Layout, timed: bool = True) -> LayerCost:
        """The loss: gathering the logits (replicated over Pr; a segmentation's only over
        the classes, :func:`~hpctrain.plan.placement.loss_layout`), and its memory: the logits
        and their gradient (kept through the backward), the softmax's temporaries, the gather.
        A segmentation's loss is priced as compute too (with ``timed``), its work growing with
        each rank's pixels."""
        target = loss_layout(self.net, last_out)
        loss = self.net.loss.name
        cost = LayerCost("loss", loss, "follow", last_out.grid)
        move, *moved = self.move_cost(last_out, target)
        cost.move, cost.redistribution = type(move), tuple(moved)
        logits = math.prod(largest_block(target)) * self.itemsize
        _, move = self.move_memory(last_out, target, len(self.net.layers) - 1)
        cost.resident = ({"logits": logits} if self.inference
                         else {"logits and their gradient": 2 * logits})
        cost.transient = larger({loss: 3 * logits}, move)
        if self.net.per_pixel:  # a loss per pixel: work that grows with each rank's pixels
            cost.work = LocalWork(PIXEL_LOSS, largest_block(target))
        if cost.work is not None and timed:
            forward, backward = self.compute.times([cost.work])[cost.work]
            cost.compute = (forward, 0.0 if self.inference else backward)
        return cost

    def prefetch(self, choices: list[list[LayerPlan]]) -> None:
        """Cost every candidate, timing all their kernels in one batch (one synchronised pass
        over the ranks instead of one per segment)."""
        costs = [cost for k, found in enumerate(choices) for c in found
                 if not (cost := self.segment_cost(k, c, timed=False)).timed]
        works = [w for cost in costs for w in works_of(cost.layers)]
        works += [LocalWork(INPUT, largest_block(self.input_layout(c))) for c in choices[0]]
        times = self.compute.times(_distinct(works))
        for cost in costs:
            self._fill_compute(cost.layers, times)
            cost.timed = True


_GENERAL = METHODS.index(GeneralMove)
_ALLGATHER = METHODS.index(AllGatherMove)


def _compacted(index: np.ndarray, size: int) -> tuple[list[int], np.ndarray]:
    """(the distinct entries of ``index``, ascending; each entry's place among them): the
    entries of a list of ``size`` that ``index`` names, and ``index`` into those alone."""
    used = np.zeros(size, dtype=bool)  # marked, not np.unique: that loads numpy.ma (13 ms)
    used[index] = True
    return np.flatnonzero(used).tolist(), (np.cumsum(used) - 1)[index]


class LayoutGrid:
    """A row per source layout and a column per target layout, numbered as first met: what
    the tables of moves between layouts of one shape are indexed by."""

    def __init__(self) -> None:
        self.rows: dict[Layout, int] = {}
        self.cols: dict[Layout, int] = {}

    def rows_of(self, srcs: list[Layout | None]) -> list[int]:
        """The row of each source layout (-1 for None), new layouts given new rows."""
        return [-1 if src is None else self.rows.setdefault(src, len(self.rows))
                for src in srcs]

    def cols_of(self, dsts: list[Layout | None]) -> list[int]:
        """The column of each target layout (-1 for None), new layouts given new columns."""
        return [-1 if dst is None else self.cols.setdefault(dst, len(self.cols))
                for dst in dsts]


class MovePrices(LayoutGrid):
    """The moves between layouts of one shape that the planner's tables asked for (its
    ``_move_grid``): a row per source layout and a column per target layout met so far, and
    for each move its method's place in
    :data:`~hpctrain.layout.moves.METHODS` (-1: not priced yet) and its forward and backward
    seconds, priced when first asked for, a table's new moves at once
    (:meth:`CostModel.move_arrays`). :meth:`CostModel.move_cost` reads a move here before it
    prices one alone: a table prices tens of thousands, a plan's evaluation reads a few."""

    def __init__(self) -> None:
        super().__init__()
        self.method = np.full((0, 0), -1, dtype=np.int64)
        self.forward = np.zeros((0, 0))
        self.backward = np.zeros((0, 0))

    def seconds(self, model: CostModel, si: np.ndarray, di: np.ndarray, rows: np.ndarray,
                cols: np.ndarray, srcs: list[Layout | None], dsts: list[Layout | None]
                ) -> np.ndarray:
        """The seconds, forward and backward, of moving ``srcs[si[m]]`` (in row ``rows[m]``)
        into ``dsts[di[m]]`` (in column ``cols[m]``), each pair m; those not priced yet priced
        here, at once."""
        have = self.method.shape
        if len(self.rows) > have[0] or len(self.cols) > have[1]:
            size = (max(len(self.rows), 2 * have[0]), max(len(self.cols), 2 * have[1]))
            self.method = _grown(self.method, size, -1)
            self.forward = _grown(self.forward, size, 0.0)
            self.backward = _grown(self.backward, size, 0.0)
        missing = np.flatnonzero(self.method[rows, cols] < 0)
        if len(missing):
            at = rows[missing], cols[missing]
            self.method[at], self.forward[at], self.backward[at] = model.move_arrays(
                srcs, dsts, si[missing], di[missing])
        return self.forward[rows, cols] + self.backward[rows, cols]

    def found(self, src: Layout, dst: Layout) -> tuple[int, float, float] | None:
        """(method, forward s, backward s) of the move ``src`` → ``dst`` if priced here."""
        row, col = self.rows.get(src), self.cols.get(dst)
        if row is None or col is None or row >= self.method.shape[0] or (
                col >= self.method.shape[1]) or self.method[row, col] < 0:
            return None
        return (int(self.method[row, col]), float(self.forward[row, col]),
                float(self.backward[row, col]))


def _grown(values: np.ndarray, size: tuple[int, int], fill: float) -> np.ndarray:
    """``values`` in the corner of an array of ``size`` filled with ``fill``."""
    grown = np.full(size, fill, dtype=values.dtype)
    grown[:values.shape[0], :values.shape[1]] = values
    return grown


def time_with_free(costs: Iterable[LayerCost], free: float) -> float:
    """The time of ``costs`` with ``free`` of each gradient sum counted free."""
    # sum() itself: from Python 3.12 it adds floats with compensation, unlike a loop's +=
    return sum([c.total - free * c.grad_sum for c in costs])


def works_of(costs: Iterable[LayerCost]) -> Iterator[LocalWork]:
    """The kernels each layer's compute is timed from: its own, then its optimizer update."""
    return (w for c in costs for w in (c.work, c.update) if w)


def _distinct(works: Iterable[LocalWork]) -> list[LocalWork]:
    """``works`` without repeats, in order: a planner's list names most works many times, and
    a compute model need price each once."""
    return list(dict.fromkeys(works))


COMPUTE_SOURCES = ("auto", "measured", "flops")


def compute_source(machine: Machine, requested: str) -> str:
    """``measured`` on this machine (its calibrated or default profile), else ``flops``."""
    if requested != "auto":
        return requested
    here = machine.name in ("local", "default") or machine.source == str(local_profile())
    return "measured" if here else "flops"


def build_cost_model(net: NetSpec, batch: int, procs: int, machine: Machine, source: str,
                     backend: Backend | None = None, comm: Any = None,
                     threads: ThreadChoice | None = None, overlap: bool = False,
                     cached: bool = True, inference: bool = False,
                     retime: bool = False, optimizer: str = "sgd",
                     accumulate: int = 1) -> CostModel:
    """A cost model whose compute times come from ``source`` (see :func:`compute_source`), for
    a run with gradient sums in flight when ``overlap`` (``--overlap``). Measured times are
    read from and added to the cache unless not ``cached``: then all are timed now.

    Measured times run on ``backend`` (NumPy float32 on this CPU when None) under ``threads``
    (the :class:`~hpctrain.device.threads.ThreadChoice` in force; None: decided and applied here by
    :func:`~hpctrain.device.threads.configure_threads`, as every command does before planning);
    under MPI every rank of ``comm`` times the same kernels at once, as the ranks of a node
    will when training. Bytes are priced in the backend's precision (fp32 when None), FLOP-rate
    compute at the profile's rate for it (:meth:`~hpctrain.cost.machine.Machine.flops_for`).
    ``inference``: the forward pass alone; ``optimizer`` and ``accumulate`` the run's
    (:class:`CostModel`).
    ``retime``: every kernel the plan needs timed afresh (``--retime``), refused where compute
    comes from FLOPs.
    """

    precision = PRECISIONS["fp32"] if backend is None else backend.precision
    if compute_source(machine, source) == "flops":
        if retime:
            raise UserError(f"--retime times the kernels again, but compute comes from FLOPs "
                            f"here (--compute {source}, machine {machine.name}): give "
                            f"--compute measured, or drop --retime")
        return CostModel(net, batch, procs, machine,
                         FlopModel(machine.flops_for(precision.name)), precision, overlap,
                         inference, optimizer, accumulate)
    if backend is None:
        from hpctrain.device.backend import Backend

        backend = Backend(np, np.float32)
    if threads is None:
        from hpctrain.device.threads import configure_threads

        threads = configure_threads(comm)
    context = timing_context(backend, threads.threads, threads.ranks_on_node, threads.blas,
                             threads.allocator, code_version(TIMED_MODULES))
    compute = MeasuredCompute(backend, comm, context, default_cache_path() if cached else None,
                              step_bytes=step_bytes(net, batch, procs, machine, precision),
                              retime=retime)
    return CostModel(net, batch, procs, machine, compute, precision, overlap, inference,
                     optimizer, accumulate)


def timing_warnings(model: CostModel) -> list[str]:
    """What ``model``'s measured compute says of how its kernels were timed (none from
    FLOPs)."""
    lines = getattr(model.compute, "conditions_lines", None)
    return lines() if lines is not None else []


def step_bytes(net: NetSpec, batch: int, procs: int, machine: Machine,
               precision: Precision = PRECISIONS["fp32"]) -> float:
    """The fewest bytes a step of ``net`` can keep on each of ``procs`` ranks, what one
    process keeps for the whole ``batch`` over P (under any plan the P ranks hold all of it at
    least once): the same for every plan of the net, so that measured kernels of all plans are
    timed from one cache state (:class:`~hpctrain.cost.compute.MeasuredCompute`)."""
    one = CostModel(net, batch, 1, machine, None, precision)
    whole = LayerPlan("batch", (1, 1))
    segments = [one.segment_cost(k, whole, timed=False) for k in range(len(one.heads))]
    kept = sum(segment.memory for segment in segments)
    kept += one.input_cost(one.input_layout(whole), timed=False).memory
    kept += one.loss_cost(segments[-1].out_layout, timed=False).memory
    return kept / procs
