"""Predicted time of every layer under every candidate (mode, Pr×Pc), as the code executes it.

A network is a chain of *segments*: a conv or linear layer (whose mode and grid are chosen) and
the layers without weights that follow it on its layout (ReLU, dropout, pooling, flatten). A
segment's cost depends on its own choice only; the redistribution feeding it depends on its
choice and the previous segment's. Per layer the model counts, forward and backward:

- compute: the local kernels at the largest local block, measured or from a FLOP rate, and the
  optimizer's update of the layer's weight shard (counted in the backward);
- communication inside the layer: ΔW all-reduced over Pc (over all P in domain mode, where W is
  replicated everywhere), halo rows exchanged with both neighbours (domain conv and pooling);
- redistribution into the layer, by the method :func:`hpctrain.moves.move_kind` picks for the
  code to run: all-gather forward and its adjoint reduce-scatter backward when a model group's
  blocks tile the needed block, nothing when every rank already holds what it needs, else
  point-to-point messages with the peers that share data, costed at the busiest receiver (the
  same in both directions).

The model-parallel all-gather is always deferred to the first layer that needs every channel:
ReLU, dropout and pooling act per channel and never grow the tensor, so deferring never costs
more. The backward of an all-gather is costed as the reduce-scatter the code runs (its exact
adjoint, half the bytes of the all-reduce the paper counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from hpctrain.cost.collectives import (
    allgather_time,
    allreduce_time,
    exchange_time,
    halo_time,
    reduce_scatter_time,
)
from hpctrain.cost.compute import (
    FlopModel,
    LocalWork,
    MeasuredCompute,
    default_cache_path,
    timing_context,
)
from hpctrain.cost.machine import Machine, local_profile
from hpctrain.layout import BATCH_AXIS, HEIGHT_AXIS, Layout
from hpctrain.moves import ALLGATHER, IDENTITY, SLICE, move_kind
from hpctrain.net import WEIGHTED, LayerSpec, NetSpec
from hpctrain.partition import SplitError, factorisations, halo_plans
from hpctrain.placement import follower_layouts, weighted_layouts

# Bytes per entry the counter RNG holds while it draws a block (uint64 indices and mixing
# temporaries, float64 before the cast), the block itself included: measured with tracemalloc on
# SyntheticData.images and dropout_mask (36.5 and 32.0).
RANDOM_BYTES = 32
BOOL_BYTES = 1
# what a parameter shard costs on every rank: its value, its gradient (the gradient all-reduce's
# flat buffer when there is one), the optimizer's momentum and its scratch buffer
PARAMETER_COPIES = ("parameters", "gradients", "momentum", "optimizer scratch")
# layers whose output is their input or a view of it: nothing new to keep
PASS_THROUGH = ("flatten",)


@dataclass(frozen=True)
class Choice:
    """A weighted layer's mode and grid."""

    mode: str
    grid: tuple[int, int]

    def describe(self) -> str:
        return f"{self.mode} {self.grid[0]}x{self.grid[1]}"


@dataclass
class LayerCost:
    """Predicted seconds (forward, backward) of one layer, and its memory per rank in bytes.

    ``resident``: what the layer keeps through a whole step (its parameter shards with their
    gradients, momentum and scratch, and what its forward saves for the backward), by name.
    ``transient``: what it allocates on top for a moment, at the larger of its forward and its
    backward (or of the redistribution feeding it), by name. Transients of different layers never
    overlap, so a plan's peak is every resident byte plus its largest transient.
    """

    layer: str
    kind: str
    mode: str
    grid: tuple[int, int]
    compute: tuple[float, float] = (0.0, 0.0)
    comm: tuple[float, float] = (0.0, 0.0)
    redistribution: tuple[float, float] = (0.0, 0.0)
    resident: dict[str, float] = field(default_factory=dict)
    transient: dict[str, float] = field(default_factory=dict)
    move: str = "identity"
    work: LocalWork | None = field(default=None, repr=False)
    update: LocalWork | None = field(default=None, repr=False)  # the optimizer, with backward

    @property
    def total(self) -> float:
        return sum(self.compute) + sum(self.comm) + sum(self.redistribution)

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
    layers: list[LayerCost]
    in_layout: Layout
    out_layout: Layout

    @property
    def total(self) -> float:
        return sum(layer.total for layer in self.layers)

    @property
    def memory(self) -> float:
        return sum(layer.memory for layer in self.layers)

    @property
    def peak(self) -> float:
        return max(layer.peak for layer in self.layers)


def larger(*phases: dict[str, float]) -> dict[str, float]:
    """The phase (forward, backward, a move) that allocates the most, by its parts."""
    return max(phases, key=lambda parts: sum(parts.values()))


def _largest_part(n: int, parts: int) -> int:
    return -(-n // parts)


def largest_block(layout: Layout) -> tuple[int, ...]:
    """The largest local shape any rank holds (blocks differ by at most one along each cut)."""
    shape = list(layout.shape)
    shape[BATCH_AXIS] = -(-shape[BATCH_AXIS] // layout.grid[1])
    if layout.split_axis is not None:
        shape[layout.split_axis] = max(hi - lo for lo, hi in layout.split_ranges)
    return tuple(shape)


def _intervals(ranks: np.ndarray, grid: tuple[int, int], split: int | None, axis: int
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """Each rank's interval of ``axis`` as fractions of its length, and the number of parts."""
    pr, pc = grid
    if axis == BATCH_AXIS:
        j = ranks // pr
        return j / pc, (j + 1) / pc, pc
    if axis == split:
        i = ranks % pr
        return i / pr, (i + 1) / pr, pr
    return np.zeros(len(ranks)), np.ones(len(ranks)), 1


@lru_cache(maxsize=65536)
def _busiest_receiver(src: tuple, dst: tuple, ndim: int) -> tuple[float, int]:
    """For layouts given as (grid, split axis): the largest share of its block a rank must
    receive from others in a general move, and the most messages a rank receives, one per
    source block it overlaps other than its own (even splits)."""
    (src_grid, src_split), (dst_grid, dst_split) = src, dst
    ranks = np.arange(src_grid[0] * src_grid[1])
    kept = np.ones(len(ranks))
    messages = np.ones(len(ranks), dtype=np.int64)
    eps = 1e-9
    for axis in range(ndim):
        s0, s1, s_parts = _intervals(ranks, src_grid, src_split, axis)
        d0, d1, _ = _intervals(ranks, dst_grid, dst_split, axis)
        kept *= np.clip(np.minimum(s1, d1) - np.maximum(s0, d0), 0, None) / (d1 - d0)
        messages *= np.ceil(d1 * s_parts - eps).astype(np.int64) - np.floor(
            d0 * s_parts + eps).astype(np.int64)
    messages -= (kept > eps).astype(np.int64)  # its own block needs no message
    return float(np.max(1 - kept)), int(np.max(messages))


class CostModel:
    """Per-segment costs of ``net`` at global batch ``batch`` on ``procs`` ranks.

    Parameters
    ----------
    machine : α–β constants (see :mod:`hpctrain.cost.machine`).
    compute : an object with ``times(works) -> {work: (forward s, backward s)}``.
    itemsize : bytes per activation and weight entry (4 for float32).
    """

    def __init__(self, net: NetSpec, batch: int, procs: int, machine: Machine, compute,
                 itemsize: int = 4) -> None:
        self.net, self.batch, self.procs, self.machine = net, batch, procs, machine
        self.compute, self.itemsize = compute, itemsize
        self.shapes = [(batch, *s) for s in net.shapes()]
        weighted = [k for k, l in enumerate(net.layers) if l.kind in WEIGHTED]
        if not weighted:
            raise SplitError(f"net {net.name} has no conv or linear layer to plan")
        self.prelude = list(range(weighted[0]))
        ends = weighted[1:] + [len(net.layers)]
        self.segments = [list(range(start, end)) for start, end in zip(weighted, ends)]
        self._segment_cache: dict[tuple[int, Choice], SegmentCost] = {}
        self._untimed_cache: dict[tuple[int, Choice], SegmentCost] = {}
        self._layout_cache: dict[tuple[int, Choice], list[tuple[Layout, Layout]] | None] = {}
        self._unrunnable: dict[tuple[int, Choice], str] = {}  # why a cached None cannot run

    # -- candidates ---------------------------------------------------------------------------

    def choices(self, segment: int) -> list[Choice]:
        """Every valid (mode, grid) of the segment's weighted layer."""
        layer = self.net.layers[self.segments[segment][0]]
        modes = ("model", "domain") if layer.kind == "conv" else ("model",)
        found = [Choice("batch", (1, self.procs))]
        found += [Choice(mode, grid) for grid in factorisations(self.procs) if grid[0] > 1
                  for mode in modes]
        return [c for c in found if self.segment_layouts(segment, c) is not None]

    def segment_layouts(self, segment: int, choice: Choice) -> list[tuple[Layout, Layout]] | None:
        """(input, output) layout of each layer of the segment, or None if the choice cannot
        run (a split with an empty part, or a halo wider than a neighbour's rows)."""
        key = (segment, choice)
        if key not in self._layout_cache:
            try:
                self._layout_cache[key] = self._segment_layouts(segment, choice)
            except SplitError as err:
                self._layout_cache[key], self._unrunnable[key] = None, str(err)
        return self._layout_cache[key]

    def runnable_layouts(self, segment: int, choice: Choice) -> list[tuple[Layout, Layout]]:
        """:meth:`segment_layouts`, refusing a choice that cannot run with the reason."""
        layouts = self.segment_layouts(segment, choice)
        if layouts is None:
            name = self.net.layers[self.segments[segment][0]].name
            raise SplitError(f"layer {name} cannot run {choice.describe()}: "
                             f"{self._unrunnable[(segment, choice)]}")
        return layouts

    def _segment_layouts(self, segment: int, choice: Choice) -> list[tuple[Layout, Layout]]:
        first = self.segments[segment][0]
        spec = self.net.layers[first]
        shape = self.shapes[first]
        pr, pc = choice.grid
        if shape[0] < pc:
            raise SplitError(f"batch {shape[0]} cannot be split over {pc} batch ranks; raise "
                             f"--batch to at least {pc} or use a grid with fewer batch ranks")
        if choice.mode != "domain" and int(spec.args["out"]) < pr:
            raise SplitError(f"{spec.args['out']} outputs cannot be split over {pr} model "
                             f"ranks; use a grid with at most {spec.args['out']}")
        layouts = [weighted_layouts(spec, shape, choice.mode, choice.grid)]
        if choice.mode == "domain":
            halo_plans(shape[2], pr, spec.window(), spec.name)
        for k in self.segments[segment][1:]:
            follower = self.net.layers[k]
            layouts.append(follower_layouts(follower, layouts[-1][1]))
            if follower.kind == "maxpool" and layouts[-1][0].split_axis == HEIGHT_AXIS:
                halo_plans(self.shapes[k][2], pr, follower.window(), follower.name)
        return layouts

    # -- costs --------------------------------------------------------------------------------

    def _work(self, spec: LayerSpec, index: int, in_layout: Layout) -> LocalWork | None:
        need_dx = index > 0
        if spec.kind == "flatten":
            return None
        block = largest_block(in_layout)
        if spec.kind in ("conv", "maxpool"):
            window = spec.window()
            pads = (window.pad, window.pad, window.pad)
            if in_layout.split_axis == HEIGHT_AXIS:
                plans = halo_plans(in_layout.shape[2], in_layout.grid[0], window, spec.name)
                p = max(plans, key=lambda q: (q.out[1] - q.out[0], q.need[1] - q.need[0]))
                block = (*block[:2], p.need[1] - p.need[0], block[3])
                pads = (p.pad_top, p.pad_bottom, window.pad)
            out = 0
            if spec.kind == "conv":
                out = (int(spec.args["out"]) if in_layout.split_axis == HEIGHT_AXIS
                       else _largest_part(int(spec.args["out"]), in_layout.grid[0]))
            return LocalWork(spec.kind, block, out, window.kernel, window.stride, pads, need_dx)
        if spec.kind == "linear":
            out = _largest_part(int(spec.args["out"]), in_layout.grid[0])
            return LocalWork("linear", block, out, need_dx=need_dx)
        return LocalWork(spec.kind, block, need_dx=need_dx)

    def _halo(self, spec: LayerSpec, layout: Layout) -> tuple[float, float]:
        """Halo exchange time of a height-split window layer: (forward, backward), busiest rank."""
        window = spec.window()
        n, c, h, w = largest_block(layout)
        row_bytes = n * c * w * self.itemsize
        forward = backward = 0.0
        for p in halo_plans(layout.shape[2], layout.grid[0], window, spec.name):
            received = [r[1] - r[0] for r in (p.recv_top, p.recv_bottom)]
            sent = [r[1] - r[0] for r in (p.send_top, p.send_bottom)]
            forward = max(forward, sum(halo_time(self.machine, k * row_bytes) for k in received))
            backward = max(backward, sum(halo_time(self.machine, k * row_bytes) for k in sent))
        return forward, backward

    def _parameters(self, index: int, choice: Choice) -> int:
        """Weight and bias entries one rank holds for weighted layer ``index``."""
        spec = self.net.layers[index]
        per_out = self.shapes[index][1] * (spec.window().kernel ** 2 if spec.kind == "conv"
                                           else 1)
        per_out += 1 if spec.args["bias"] else 0
        out = int(spec.args["out"])
        return per_out * (out if choice.mode == "domain" else _largest_part(out, choice.grid[0]))

    def _weight_allreduce(self, index: int, choice: Choice) -> float:
        """ΔW and Δb, one all-reduce: over Pc, or over all P in domain mode (W everywhere)."""
        ranks = self.procs if choice.mode == "domain" else choice.grid[1]
        return allreduce_time(self.machine, ranks, self._parameters(index, choice) * self.itemsize)

    def move_cost(self, src: Layout, dst: Layout) -> tuple[str, float, float]:
        """(kind, forward s, backward s) of redistributing ``src`` into ``dst``."""
        kind = move_kind(src, dst)
        if kind in (IDENTITY, SLICE):
            return kind, 0.0, 0.0
        block_bytes = math.prod(largest_block(dst)) * self.itemsize
        if kind == ALLGATHER:
            pr = dst.grid[0]
            return (kind, allgather_time(self.machine, pr, block_bytes),
                    reduce_scatter_time(self.machine, pr, block_bytes))
        share, messages = _busiest_receiver((src.grid, src.split_axis),
                                            (dst.grid, dst.split_axis), len(dst.shape))
        t = exchange_time(self.machine, self.procs, messages, share * block_bytes)
        return kind, t, t

    def kept_upstream(self, index: int) -> bool:
        """Whether the array that reaches layer ``index`` (when no move intervenes) is kept
        anyway: the input batch, or the output of a ReLU or pooling, looked at through views."""
        k = index - 1
        while k >= 0 and self.net.layers[k].kind in PASS_THROUGH:
            k -= 1
        return k < 0 or self.net.layers[k].kind in ("relu", "maxpool")

    def keeps_input(self, index: int) -> bool:
        """Whether layer ``index`` keeps its input array for the backward (linear; pooling
        reads its windows from the unpadded input)."""
        spec = self.net.layers[index]
        return spec.kind == "linear" or (spec.kind == "maxpool" and spec.window().pad == 0)

    def _memory(self, index: int, in_layout: Layout, out_layout: Layout,
                work: LocalWork | None, params: int, fresh_input: bool
                ) -> tuple[dict[str, float], dict[str, float]]:
        """(resident, transient) bytes of layer ``index`` on the busiest rank, by name.

        What the code keeps, read from the layers and kernels: conv its im2col columns, ReLU its
        output, dropout its mask, pooling its output and the (padded) input its windows view,
        linear its input; a weighted layer its shards with gradient, momentum and the
        optimizer's scratch. Between steps every layer still holds the previous step's arrays,
        so a forward allocates what it keeps a second time before the old copy goes.
        ``fresh_input``: a move (not the identity) made the input array.
        """
        spec, b = self.net.layers[index], self.itemsize
        x = math.prod(largest_block(in_layout)) * b
        y = math.prod(largest_block(out_layout)) * b
        kept_before = self.kept_upstream(index) and not fresh_input
        loose_input = {} if kept_before else {"input": x}  # alive in the caller meanwhile
        resident = {what: params * b for what in PARAMETER_COPIES} if params else {}
        if self.keeps_input(index) and not kept_before:
            resident["input"] = x
        weights = {"weight gradient": params * b} if params else {}
        if spec.kind == "conv":
            n, c, h, w = work.x
            top, bottom, side = work.pads
            ho, wo = work.out_rows()
            cols = c * work.kernel ** 2 * n * ho * wo * b
            copy = n * c * (h + top + bottom) * (w + 2 * side) * b
            split = in_layout.split_axis == HEIGHT_AXIS
            if not (top or bottom or side or split):
                copy = 0
            y = n * work.out * ho * wo * b
            resident["im2col columns"] = cols
            forward = {**loose_input, "im2col workspace": cols, "padded input": copy,
                       "output and GEMM result": 2 * y}
            backward = {"output gradient and its transpose": 2 * y, **weights}
            if work.need_dx:
                backward.update({"im2col workspace": cols, "padded input gradient": copy})
            return resident, larger(forward, backward)
        if spec.kind == "maxpool":
            n, c, h, w = work.x
            top, bottom, side = work.pads
            ho, wo = work.out_rows()
            y = n * c * ho * wo * b
            padded = n * c * (h + top + bottom) * (w + 2 * side) * b
            resident["output"] = y
            if top or bottom or side or in_layout.split_axis == HEIGHT_AXIS:
                resident["padded input"] = padded  # a fresh copy its windows view
                forward = {**loose_input, "padded input": padded, "output": y}
            else:  # the previous step's input, held by the previous windows, and the output
                forward = {"input": x, "output": y}
            backward = {"output gradient": y, "padded input gradient": padded,
                        "window masks": y + 3 * y // b * BOOL_BYTES}
            return resident, larger(forward, backward)
        if spec.kind == "relu":
            resident["output"] = y
            return resident, larger({**loose_input, "output": y},
                                    {"output gradient": y, "input gradient": x,
                                     "sign mask": x // b * BOOL_BYTES})
        if spec.kind == "dropout" and float(spec.args["p"]) > 0:
            entries = x // b
            resident["mask"] = x
            return resident, larger({**loose_input, "random numbers": entries * RANDOM_BYTES,
                                     "output": y},
                                    {"output gradient": y, "input gradient": x})
        if spec.kind == "linear":
            return resident, larger({"input": x, "output": y},
                                    {"output gradient": y, **weights,
                                     "input gradient": x if work.need_dx else 0})
        return resident, {}

    def move_memory(self, src: Layout, dst: Layout, index: int
                    ) -> tuple[dict[str, float], dict[str, float]]:
        """(resident, transient) bytes of moving ``src`` into ``dst`` for layer ``index``, on
        top of what the layer's own estimate counts (which assumes no move): the new array when
        the layer keeps it, and the buffers of the move (forward: a contiguous copy of the
        block, the receive buffer, the result; backward the same for the gradient)."""
        kind = move_kind(src, dst)
        if kind == IDENTITY:
            return {}, {}
        b = self.itemsize
        s, d = math.prod(largest_block(src)) * b, math.prod(largest_block(dst)) * b
        resident = ({"moved input": d} if self.keeps_input(index) and self.kept_upstream(index)
                    else {})
        if kind == SLICE:
            return resident, {"redistribution buffers": s + d}
        return resident, {"redistribution buffers": 2 * (s + d)}

    def data_memory(self, first_in: Layout) -> tuple[dict[str, float], dict[str, float]]:
        """The input batch block, kept through the step, and the RNG drawing it."""
        entries = math.prod(largest_block(first_in))
        return {"input batch": entries * self.itemsize}, {"random numbers":
                                                          entries * RANDOM_BYTES}

    def loss_memory(self, last_out: Layout) -> tuple[dict[str, float], dict[str, float]]:
        """The logits and their gradient (kept through the backward), the softmax's
        temporaries, and the gather of the logits."""
        target = last_out.replicated()
        logits = math.prod(largest_block(target)) * self.itemsize
        _, move = self.move_memory(last_out, target, len(self.net.layers) - 1)
        return ({"logits and their gradient": 2 * logits},
                larger({"softmax": 3 * logits}, move))

    def segment_cost(self, segment: int, choice: Choice, timed: bool = True) -> SegmentCost:
        """Every layer of the segment under ``choice``, without the move feeding the segment;
        ``timed`` False: no kernel is timed (compute left at zero), memory and moves only."""
        if not timed:
            key = (segment, choice)
            if key not in self._untimed_cache:
                self._untimed_cache[key] = self._segment_cache.get(key) or \
                    self._segment_untimed(segment, choice)
            return self._untimed_cache[key]
        key = (segment, choice)
        if key not in self._segment_cache:
            cost = self._segment_untimed(segment, choice)
            self._fill_compute(cost.layers)
            self._segment_cache[key] = cost
        return self._segment_cache[key]

    def _fill_compute(self, costs: list[LayerCost]) -> None:
        """Each layer's compute: its kernels' times, plus the optimizer's in the backward."""
        times = self.compute.times([w for c in costs for w in (c.work, c.update) if w])
        for cost in costs:
            if cost.work is not None:
                cost.compute = times[cost.work]
            if cost.update is not None:
                cost.compute = (cost.compute[0], cost.compute[1] + sum(times[cost.update]))

    def _segment_untimed(self, segment: int, choice: Choice) -> SegmentCost:
        layouts = self.runnable_layouts(segment, choice)
        costs = []
        previous_out = None
        for index, (in_layout, out_layout) in zip(self.segments[segment], layouts, strict=True):
            spec = self.net.layers[index]
            cost = LayerCost(spec.name, spec.kind, choice.mode if index == self.segments[
                segment][0] else "follow", choice.grid)
            if previous_out is not None:  # flatten gathers height-split rows
                cost.move, *moved = self.move_cost(previous_out, in_layout)
                cost.redistribution = tuple(moved)
            cost.work = self._work(spec, index, in_layout)
            params = 0
            if spec.kind in WEIGHTED:
                cost.comm = (0.0, self._weight_allreduce(index, choice))
                params = self._parameters(index, choice)
                cost.update = LocalWork("sgd", (params,))
            if spec.kind in ("conv", "maxpool") and in_layout.split_axis == HEIGHT_AXIS:
                halo = self._halo(spec, in_layout)
                cost.comm = (cost.comm[0] + halo[0], cost.comm[1] + halo[1])
            cost.resident, cost.transient = self._memory(
                index, in_layout, out_layout, cost.work, params, cost.move != IDENTITY)
            if cost.move != IDENTITY:
                _, moving = self.move_memory(previous_out, in_layout, index)
                cost.transient = larger(cost.transient, moving)
            costs.append(cost)
            previous_out = out_layout
        return SegmentCost(costs, layouts[0][0], layouts[-1][1])

    def input_layout(self, first: Choice) -> Layout:
        """Where the input batch is produced: on 1×P before leading layers without weights,
        else in the first weighted layer's input layout."""
        if self.prelude:
            return Layout(self.shapes[0], (1, self.procs))
        return self.runnable_layouts(0, first)[0][0]

    def prelude_layout(self) -> Layout | None:
        """The layout leading layers without weights run on (1×P), or None without any."""
        if not self.prelude:
            return None
        layout = Layout(self.shapes[0], (1, self.procs))
        for k in self.prelude:
            layout = follower_layouts(self.net.layers[k], layout)[1]
        return layout

    def prelude_costs(self, timed: bool = True) -> list[LayerCost]:
        costs = []
        layout = Layout(self.shapes[0], (1, self.procs))
        for k in self.prelude:
            spec = self.net.layers[k]
            in_layout, layout = follower_layouts(spec, layout)
            cost = LayerCost(spec.name, spec.kind, "follow", (1, self.procs))
            cost.work = self._work(spec, k, in_layout)
            cost.resident, cost.transient = self._memory(k, in_layout, layout, cost.work, 0,
                                                         False)
            costs.append(cost)
        if timed:
            self._fill_compute(costs)
        return costs

    def input_cost(self, first_in: Layout, timed: bool = True) -> LayerCost:
        """Producing each rank's block of the input batch (synthetic data here), per step."""
        work = LocalWork("data", largest_block(first_in))
        cost = LayerCost("input", "data", "follow", first_in.grid, work=work)
        cost.resident, cost.transient = self.data_memory(first_in)
        if timed:
            cost.compute = self.compute.times([work])[work]
        return cost

    def loss_cost(self, last_out: Layout) -> tuple[str, float, float]:
        """Gathering the logits for the loss (replicated over Pr)."""
        return self.move_cost(last_out, last_out.replicated())

    def prefetch(self, choices: list[list[Choice]]) -> None:
        """Cost every candidate, timing all their kernels in one batch (one synchronised pass
        over the ranks instead of one per segment)."""
        fresh = {(k, c): self._segment_untimed(k, c) for k, found in enumerate(choices)
                 for c in found if (k, c) not in self._segment_cache}
        works = [w for cost in fresh.values() for c in cost.layers for w in (c.work, c.update)
                 if w]
        works += [LocalWork("data", largest_block(self.input_layout(c))) for c in choices[0]]
        self.compute.times(works)
        for key, cost in fresh.items():
            self._fill_compute(cost.layers)
            self._segment_cache[key] = cost

COMPUTE_SOURCES = ("auto", "measured", "flops")


def compute_source(machine: Machine, requested: str) -> str:
    """``measured`` on this machine (its calibrated or default profile), else ``flops``."""
    if requested != "auto":
        return requested
    here = machine.name in ("local", "default") or machine.source == str(local_profile())
    return "measured" if here else "flops"


def build_cost_model(net: NetSpec, batch: int, procs: int, machine: Machine, source: str,
                     backend=None, comm=None, threads=None) -> CostModel:
    """A cost model whose compute times come from ``source`` (see :func:`compute_source`).

    Measured times run on ``backend`` (NumPy float32 on this CPU when None) under ``threads``
    (the :class:`~hpctrain.threads.ThreadChoice` in force; None: decided and applied here by
    :func:`~hpctrain.threads.configure_threads`, as every command does before planning);
    under MPI every rank of ``comm`` times the same kernels at once, as the ranks of a node
    will when training.
    """
    import numpy as np

    itemsize = 4 if backend is None else np.dtype(backend.dtype).itemsize
    if compute_source(machine, source) == "flops":
        return CostModel(net, batch, procs, machine, FlopModel(machine.flops), itemsize)
    if backend is None:
        from hpctrain.backend import Backend

        backend = Backend(np, np.float32)
    if threads is None:
        from hpctrain.threads import configure_threads

        threads = configure_threads(comm)
    context = timing_context(backend, threads.threads, threads.ranks_on_node, threads.blas)
    compute = MeasuredCompute(backend, comm, context, default_cache_path())
    return CostModel(net, batch, procs, machine, compute, itemsize)
