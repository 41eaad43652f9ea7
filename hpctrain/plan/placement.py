"""Where each layer's inputs and output sit under its plan entry (pure; no MPI).

The distributed layers take their layouts from here, and the cost model predicts a plan from the
same layouts, so prediction and execution cannot disagree on what moves where. Each kind says
which layouts it takes (:meth:`hpctrain.model.kinds.base.Kind.layouts`):

- a weighted kind (conv, linear) takes the layouts of its mode on its grid;
- any other kind follows its first input's layout; its other inputs (add, concat) are moved to
  what it asks for;
- the input batch is produced where the first layer reads it: in its input layout when it is
  weighted (and no layer without weights follows the input), else batch-parallel on 1×P.

:func:`plan_layouts` gives every layer's layouts under a whole plan and :func:`move_pairs` every
move between them; the network builds its redistributions from these.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.layout.layout import Layout
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
    inputs, output = kind.layouts(spec, fed, out_shape, entry.mode, entry.grid)
    kind.check(spec, inputs, output)
    return LayerLayouts(inputs, output)


def batch_parallel_input(net: NetSpec) -> bool:
    """Whether the input batch is produced batch-parallel on 1×P: unless the first layer is
    weighted and reads it, and no layer without weights follows it (reads it first)."""
    first_readers = [k for k in range(len(net.layers)) if net.producers(k)[0] == -1]
    return not (net.producers(0) == (-1,) and all(
        KINDS[net.layers[k].kind].weighted for k in first_readers))


def input_layout(net: NetSpec, plan: list[LayerPlan], batch: int, procs: int) -> Layout:
    """Where each rank's block of the input batch is produced: where the first layer reads it
    (see :func:`batch_parallel_input`), else on 1×P."""
    source = Layout((batch, *net.input_shape), (1, procs))
    if batch_parallel_input(net):
        return source
    return layer_layouts(net, 0, (source,), plan[0], batch).input


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
