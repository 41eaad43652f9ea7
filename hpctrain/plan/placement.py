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

:func:`plan_layouts` gives every layer's layouts under a whole plan and :func:`move_pairs` every
move between them; the network builds its redistributions from these.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.layout.layout import Layout, axis_name
from hpctrain.layout.partition import check_split
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetSpec
from hpctrain.plan.plans import LayerPlan


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
    return input_layout_for(net, plan[k] if k is not None else LayerPlan("follow"), batch,
                            procs)


def plan_layouts(net: NetSpec, plan: list[LayerPlan], batch: int, procs: int
                 ) -> list[LayerLayouts]:
    """The layouts of every layer of ``net`` under ``plan`` on ``procs`` ranks."""
    source = input_layout(net, plan, batch, procs)
    layouts: list[LayerLayouts] = []
    for k in range(len(net.layers)):
        fed = tuple(source if p < 0 else layouts[p].output for p in net.producers(k))
        layouts.append(layer_layouts(net, k, fed, plan[k], batch))
    return layouts


def move_pairs(net: NetSpec, layouts: list[LayerLayouts], source: Layout
               ) -> list[tuple[Layout, Layout]]:
    """(source, target) of every move of ``net`` whose layers have ``layouts`` and whose input
    batch is produced on ``source``: each layer's inputs in order, layer by layer, then the move
    of the logits to the loss, replicated over the last grid's Pr ranks."""
    pairs = []
    for k, layer in enumerate(layouts):
        for p, target in zip(net.producers(k), layer.inputs, strict=True):
            pairs.append((source if p < 0 else layouts[p].output, target))
    last = layouts[-1].output
    pairs.append((last, last.replicated()))
    return pairs
