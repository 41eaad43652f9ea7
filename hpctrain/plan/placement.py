"""Where each layer's inputs and output sit under its plan entry (pure; no MPI).

The distributed layers take their layouts from here, and the cost model predicts a plan from the
same layouts, so prediction and execution cannot disagree on what moves where. Each kind says
which layouts it takes (:meth:`hpctrain.model.kinds.base.Kind.layouts`):

- a weighted kind (conv, linear) takes the layouts of its mode on its grid;
- any other kind follows its first input's layout; its other inputs (add, concat) are moved to
  what it asks for;
- the input batch is produced where its first weighted reader reads it: on the layout the first
  weighted layer of the net takes under its plan entry, carried over to the input's shape (its
  mesh, and its split of the spatial axes where it splits them). Layers without weights before it (a
  batch norm of the input, say) run there too, and the weighted layer reads its input without
  a move. Example, 4 ranks: ``batchnorm`` then ``conv`` on 4×1 in model mode reads its input
  replicated over the 4 ranks, so the batch is produced replicated and the batch norm runs on
  the whole batch on every rank; a batch of 3 then needs no split into 4.

Groups of ranks: a weighted layer whose plan entry names ``ranks A-B`` takes the layouts of its
split on those B − A + 1 ranks, placed on them (:meth:`~hpctrain.layout.layout.Layout.on_ranks`);
the layers without weights after it follow it there. A layer without weights that joins
layouts on different ranks (the concat of an Inception module whose branches run on groups, the
add of a ResNet block) runs on the ranks and layout of its fork–join region's fork
(:mod:`hpctrain.model.regions`), carried over to its shape: where the branches came from. The
first weighted layer (it reads the input batch) and the net's last layer (the loss) run on every
rank.

:func:`plan_layouts` gives every layer's layouts under a whole plan and :func:`move_pairs` every
move between them; the network builds its redistributions from these, and runs them and the
layers in the order :func:`schedule` gives.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from hpctrain.layout.layout import CHANNEL_AXIS, Layout, axis_name
from hpctrain.layout.moves import same_ranks
from hpctrain.layout.partition import check_split
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetSpec
from hpctrain.model.regions import fork_join_regions
from hpctrain.plan.plans import FOLLOW, LayerPlan, PlanError, ranks_text


@dataclass(frozen=True)
class LayerLayouts:
    """The layouts a layer reads its inputs in (in order) and gives its output in."""

    inputs: tuple[Layout, ...]
    output: Layout

    @property
    def input(self) -> Layout:
        """The first input's layout (the only one of most kinds)."""
        return self.inputs[0]


def layer_layouts(net: NetSpec, k: int, fed: tuple[Layout, ...], entry: LayerPlan,
                  batch: int) -> LayerLayouts:
    """Layouts of layer ``k`` fed its inputs on ``fed`` under plan entry ``entry``; refused
    with a :class:`~hpctrain.layout.partition.SplitError` naming the layer when they cannot run."""
    spec = net.layers[k]
    kind = KINDS[spec.kind]
    out_shape = (batch, *net.out_shapes[k])
    split = entry.split_of(len(out_shape)) if kind.weighted else None
    inputs, output = kind.layouts(spec, fed, out_shape, split)
    kind.check(spec, inputs, output)
    if entry.ranks is not None:  # the split's layouts, on its group of the world's ranks
        first, procs = entry.ranks[0], fed[0].procs
        inputs = tuple(layout.on_ranks(first, procs) for layout in inputs)
        output = output.on_ranks(first, procs)
    return LayerLayouts(inputs, output)


def first_weighted(net: NetSpec) -> int | None:
    """The first weighted layer in net order (None: the net has none)."""
    return next((k for k, spec in enumerate(net.layers) if KINDS[spec.kind].weighted), None)


def input_layout_for(net: NetSpec, first: LayerPlan, batch: int, procs: int) -> Layout:
    """Where each rank's block of the input batch is produced when the first weighted layer
    has plan entry ``first``: on the layout that layer reads (from shapes alone, as a weighted
    kind lays out), carried over to the input's shape. A net without weighted layers takes it
    batch-parallel on 1×P."""
    source = Layout((batch, *net.input_shape), (1, procs))
    k = first_weighted(net)
    if k is None:
        return source
    if first.ranks is not None:
        raise PlanError(f"layer {net.layers[k].name} reads the input batch, which every rank "
                        f"reads a block of; run it on all ranks (drop its "
                        f"'{ranks_text(first.ranks)}')")
    fed = tuple(Layout((batch, *shape), (1, procs)) for shape in net.in_shapes(k))
    read = layer_layouts(net, k, fed, first, batch).input
    if len(read.shape) != len(source.shape):  # e.g. a flatten before: the batch split alone
        read = read.replicated()
    produced = Layout(source.shape, mesh=read.mesh, axes=read.axes)
    for axis in produced.cut_axes:
        check_split(source.shape[axis], produced.parts[axis],
                    f"input {axis_name(source.shape, axis)}", net.layers[k].name)
    return produced


def input_layout(net: NetSpec, plan: list[LayerPlan], batch: int, procs: int) -> Layout:
    """Where each rank's block of the input batch is produced under ``plan``
    (:func:`input_layout_for` its first weighted layer's entry)."""
    k = first_weighted(net)
    return input_layout_for(net, plan[k] if k is not None else FOLLOW, batch,
                            procs)


def plan_layouts(net: NetSpec, plan: list[LayerPlan], batch: int, procs: int
                 ) -> list[LayerLayouts]:
    """The layouts of every layer of ``net`` under ``plan`` on ``procs`` ranks."""
    _check_groups(net, plan, procs)
    source = input_layout(net, plan, batch, procs)
    layouts: list[LayerLayouts] = []
    forks = {region.join: region.fork for region in reversed(fork_join_regions(net))}
    for k in range(len(net.layers)):
        fed = tuple(source if p < 0 else layouts[p].output for p in net.producers(k))
        if not KINDS[net.layers[k].kind].weighted and not all(
                same_ranks(fed[0], other) for other in fed[1:]):
            fed = (_joined_on(net, k, fed, forks, source, layouts), *fed[1:])
        layouts.append(layer_layouts(net, k, fed, plan[k], batch))
    last = layouts[-1].output
    if last.on_group:
        raise PlanError(f"the net's last layer {net.layers[-1].name} runs on ranks "
                        f"{last.first}-{last.first + last.size - 1}, but the loss needs every "
                        f"rank; run the layers after the last join on all ranks")
    return layouts


def _joined_on(net: NetSpec, k: int, fed: tuple[Layout, ...], forks: dict[int, int],
               source: Layout, layouts: list[LayerLayouts]) -> Layout:
    """The layout a layer without weights reading layouts on different ranks takes its first
    input on: its region's fork's output, carried over to the first input's shape (the
    module's text); refused where the layer joins no region."""
    fork = forks.get(k)
    if fork is None:
        raise PlanError(f"layer {net.layers[k].name} reads layers on different groups of ranks "
                        f"but joins no fork; run its inputs on the same ranks")
    return (source if fork < 0 else layouts[fork].output).with_shape(fed[0].shape)


def _check_groups(net: NetSpec, plan: list[LayerPlan], procs: int) -> None:
    """Refuse, naming the layers, two groups that overlap without one holding the other (no
    layout could hand over between them without serialising both)."""
    groups: dict[tuple[int, int], str] = {}
    for spec, entry in zip(net.layers, plan, strict=True):
        if entry.ranks is None or entry.ranks in groups:
            continue
        first, size = entry.ranks
        if first + size > procs:
            raise PlanError(f"layer {spec.name}: {ranks_text(entry.ranks)} lie outside the "
                            f"ranks 0-{procs - 1} launched")
        for (a, n), name in groups.items():
            meet = max(first, a) < min(first + size, a + n)
            nested = (a <= first and first + size <= a + n) or (first <= a and a + n <= first
                                                                 + size)
            if meet and not nested:
                raise PlanError(f"layer {spec.name} on {ranks_text(entry.ranks)} overlaps layer "
                                f"{name} on {ranks_text((a, n))} without either holding the "
                                f"other; give branches disjoint blocks of ranks")
        groups[entry.ranks] = spec.name


def move_pairs(net: NetSpec, layouts: list[LayerLayouts], source: Layout
               ) -> list[tuple[Layout, Layout]]:
    """(source, target) of every move of ``net`` whose layers have ``layouts`` and whose input
    batch is produced on ``source``: each layer's inputs in order, layer by layer, then the move
    of the logits to the loss (:func:`loss_layout`)."""
    pairs = []
    for k, layer in enumerate(layouts):
        for p, target in zip(net.producers(k), layer.inputs, strict=True):
            pairs.append((source if p < 0 else layouts[p].output, target))
    last = layouts[-1].output
    pairs.append((last, loss_layout(net, last)))
    return pairs


def loss_layout(net: NetSpec, last: Layout) -> Layout:
    """Where the loss reads the logits the last layer gives on ``last``: replicated over the
    last grid's Pr ranks, every class of a sample on one rank; for a segmentation net
    (:attr:`~hpctrain.model.net.NetSpec.per_pixel`) only the classes are gathered, and each
    rank keeps its block of pixels: a domain split's cuts stay, no image is gathered whole.
    Example, 4 ranks, the last layer on 2x2 in domain mode, (N, K, H, W) cut N/2, H/2: the
    loss reads the same blocks, and each rank sums the loss of its own rows."""
    if net.per_pixel:
        return last.without((CHANNEL_AXIS,))
    return last.replicated()


@dataclass(frozen=True, order=True)
class Step:
    """One step of the forward, in :func:`schedule`'s order: layer ``layer`` itself
    (``input`` None) or the move into its input ``input``."""

    layer: int
    input: int | None = None


def schedule(net: NetSpec, layouts: list[LayerLayouts], source: Layout) -> list[Step]:
    """The order every rank runs the forward's moves and layers in, skipping those it takes no
    part in (the backward runs it reversed). Every rank follows one order, and each step waits
    only for its own ranks, so nothing can wait forever: by induction along the order, every
    rank of a step has finished the steps before it when it reaches it.

    A topological order of the net's graph that, among the steps ready to run, takes first
    those whose *source* lies on every rank (a layer on the world, a move out of a layout on
    the world), then the rest, each in net order. So the moves that fork a region's branches
    out to their groups, and the layers on every rank inside it, all run at its start; the
    groups then run their branches side by side, each skipping the others'. Without groups
    every step's source is on every rank, and the order is the net's: each layer's moves, then
    the layer."""
    def on_world(step: Step) -> bool:
        if step.input is None:
            return not layouts[step.layer].output.on_group
        p = net.producers(step.layer)[step.input]
        return not (source if p < 0 else layouts[p].output).on_group

    def key(step: Step) -> tuple:
        position = len(net.producers(step.layer)) if step.input is None else step.input
        return (not on_world(step), step.layer, position)

    waiting = {k: len(net.producers(k)) for k in range(len(net.layers))}  # moves not yet run
    ready = [key(Step(k, e)) for k in range(len(net.layers))
             for e, p in enumerate(net.producers(k)) if p < 0]
    heapq.heapify(ready)
    order: list[Step] = []
    while ready:
        _, k, position = heapq.heappop(ready)
        if position == len(net.producers(k)):
            order.append(Step(k))
            for reader in dict.fromkeys(net.consumers.get(k, ())):
                for e, p in enumerate(net.producers(reader)):
                    if p == k:
                        heapq.heappush(ready, key(Step(reader, e)))
        else:
            order.append(Step(k, position))
            waiting[k] -= 1
            if not waiting[k]:
                heapq.heappush(ready, key(Step(k)))
    return order
