"""A net cut into segments, and where each segment's layers sit under each of its candidates.

A *segment* is a weighted layer (conv, linear), its *head*, whose mode and grid the plan
chooses, and the layers without weights that follow it, through their first inputs, on its
layout (ReLU, batch norm, pooling, flatten, an add or concat whose first input it feeds). The
first segment also holds the layers without weights that read the input batch before any
weighted layer (a batch norm of the input): the batch is produced on the layout the first head
reads (:func:`hpctrain.plan.placement.input_layout_for`), so their layouts follow its choice.
Everything between segments that a segment's own layouts do not decide is a *join*: a move
into a head from another segment or the input, or into an add's or concat's other inputs.

The cost model (:class:`hpctrain.plan.pricing.CostModel`) prices what this lays out; the
planner searches over each segment's candidates (:meth:`Segments.choices`).
"""

from __future__ import annotations

from functools import lru_cache

from hpctrain.layout.layout import Layout, Split
from hpctrain.layout.partition import SplitError, factorisations, ordered_factorisations
from hpctrain.model.kinds import KINDS
from hpctrain.model.kinds.base import Kind
from hpctrain.model.kinds.weighted import SplitsInputs
from hpctrain.model.net import NetSpec
from hpctrain.plan.placement import LayerLayouts, input_layout_for, layer_layouts
from hpctrain.plan.plans import LayerPlan


class Segments:
    """``net`` at global batch ``batch`` on ``procs`` ranks, cut into segments.

    ``segments[s]`` lists the layers of segment s in net order: its head ``heads[s]`` and
    its followers (and, in the first segment, the layers before its head that read the input);
    ``joins`` the (layer, input, producer) of every move between segments (-1: the input batch).
    A segment's layouts under a candidate are made once for all segments alike.
    """

    def __init__(self, net: NetSpec, batch: int, procs: int) -> None:
        self.net, self.batch, self.procs = net, batch, procs
        self.shapes = [(batch, *s) for s in net.shapes()]
        weighted = [k for k, spec in enumerate(net.layers) if KINDS[spec.kind].weighted]
        if not weighted:
            raise SplitError(f"net {net.name} has no conv or linear layer to plan")
        self.heads = weighted
        anchors: list[int] = []  # the head each layer follows (the first for the input's)
        for k, spec in enumerate(net.layers):
            first = net.producers(k)[0]
            anchors.append(k if KINDS[spec.kind].weighted else
                           (anchors[first] if first >= 0 else weighted[0]))
        members: dict[int, list[int]] = {w: [] for w in weighted}
        for k, anchor in enumerate(anchors):  # in net order within each segment
            members[anchor].append(k)
        self.segments = [members[w] for w in weighted]
        # (layer, input, producer) of every edge the segments do not price: into a head from
        # outside its segment, or into another than the first input (a follower's first input
        # is fed inside its segment); -1 is the input batch
        self.joins = tuple((k, e, p) for k, spec in enumerate(net.layers)
                           for e, p in enumerate(net.producers(k))
                           if e > 0 or (KINDS[spec.kind].weighted
                                        and (p < 0 or anchors[p] != anchors[k])))
        self._layout_cache: dict[tuple[int, LayerPlan], list[LayerLayouts] | None] = {}
        self._input_layouts: dict[LayerPlan, Layout] = {}  # by the first segment's choice
        # each layer's inputs by their shapes alone, on 1×P (see fed)
        self._unplaced = [tuple(Layout((batch, *(net.input_shape if p < 0 else net.out_shapes[p])),
                                       (1, procs)) for p in net.producers(k))
                          for k in range(len(net.layers))]
        # A net repeats its blocks: layers alike (see _layer_facts) share a number, and are
        # priced once on equal layouts; each segment knows the first segment alike (see
        # _segment_facts), which is laid out for it
        numbers: dict[tuple, int] = {}
        self._alike_layer = [numbers.setdefault(self._layer_facts(k), len(numbers))
                             for k in range(len(net.layers))]
        firsts: dict[tuple, int] = {}
        self._first_alike = [firsts.setdefault(self._segment_facts(members), s)
                             for s, members in enumerate(self.segments)]
        self._laid_out: dict[tuple, LayerLayouts] = {}  # see layer_layouts

    @property
    def segment_kinds(self) -> list[Kind]:
        """The kind of each segment's weighted layer, in order."""
        return [KINDS[self.net.layers[head].kind] for head in self.heads]

    def choices(self, segment: int) -> list[LayerPlan]:
        """Every valid (mode, grid) of the segment's weighted layer."""
        kind = KINDS[self.net.layers[self.heads[segment]].kind]
        found = [LayerPlan("batch", (1, self.procs))]
        found += [LayerPlan(mode, grid) for grid in factorisations(self.procs) if grid[0] > 1
                  for mode in kind.modes]
        return [c for c in found if self.segment_layouts(segment, c) is not None]

    def split_choices(self, segment: int, space: str = "axes") -> list[LayerPlan]:
        """The splits of the segment's weighted layer beyond :meth:`choices` (those of
        :meth:`candidate_splits`) that can run and are not one of the 1.5D modes."""
        known = set(self.choices(segment))
        found = []
        for split in self.candidate_splits(segment, space):
            choice = LayerPlan("split", split=split)
            if choice.mode == "split" and choice not in known and (
                    self.segment_layouts(segment, choice) is not None):
                found.append(choice)
        return found

    def candidate_splits(self, segment: int, space: str = "axes") -> list[Split]:
        """The splits of ``space`` for the segment's weighted layer, from its sizes alone
        (none laid out): a degree for every axis of its output (sample, channels, each spatial
        axis) and a number of replicas, multiplying to P, every such split (``space`` "axes")
        or only the balanced ones (:func:`balanced_degrees`); and for a conv or linear layer
        the splits of its input channels too (:func:`input_splits`)."""
        shape = self.output_shape(segment)
        degrees_of = whole_degrees if space == "axes" else balanced_degrees
        splits = [Split(degrees[:-1], degrees[-1]) for degrees in degrees_of(self.procs, shape)]
        head = self.heads[segment]
        if isinstance(KINDS[self.net.layers[head].kind], SplitsInputs):
            splits += input_splits(self.procs, shape, self.net.in_shapes(head)[0][0], space)
        return splits

    def output_shape(self, segment: int) -> tuple[int, ...]:
        """The whole output of the segment's weighted layer, the batch first: what its splits
        cut."""
        return (self.batch, *self.net.out_shapes[self.heads[segment]])

    def _layer_facts(self, index: int) -> tuple:
        """All that pricing layer ``index`` on given layouts reads of the net, its name aside:
        its kind and options (a kind lays out and prices a layer from these, the name only
        labelling a refusal), whether its input gradient is wanted, whether what reaches it is
        kept anyway, and whether its output has several readers."""
        spec = self.net.layers[index]
        return (spec.kind, spec.options, self.net.reads_layers(index),
                self.kept_upstream(index), len(self.net.consumers.get(index, ())) > 1)

    def _segment_facts(self, members: list[int]) -> tuple:
        """All that laying out and pricing a segment under a choice reads of the net, names
        aside: per layer, its number alike, which member feeds its first input, and the shapes
        of its inputs and output."""
        net, position = self.net, {k: i for i, k in enumerate(members)}
        return tuple((self._alike_layer[k], position.get(net.producers(k)[0]),
                      tuple(net.input_shape if p < 0 else net.out_shapes[p]
                            for p in net.producers(k)), net.out_shapes[k]) for k in members)

    def segment_layouts(self, segment: int, choice: LayerPlan) -> list[LayerLayouts] | None:
        """Layouts of each layer of the segment, or None if the choice cannot run (a split
        with an empty part, or a halo wider than a neighbour's rows). Made once for all
        segments alike."""
        key = (self._first_alike[segment], choice)
        if key not in self._layout_cache:
            try:
                self._layout_cache[key] = self._segment_layouts(*key)
            except SplitError:
                self._layout_cache[key] = None
        return self._layout_cache[key]

    def runnable_layouts(self, segment: int, choice: LayerPlan) -> list[LayerLayouts]:
        """:meth:`segment_layouts`, refusing a choice that cannot run with the reason."""
        layouts = self.segment_layouts(segment, choice)
        if layouts is not None:
            return layouts
        name = self.net.layers[self.heads[segment]].name
        try:  # refused again, for a reason that names this segment's layers (not its twin's)
            return self._segment_layouts(segment, choice)
        except SplitError as err:
            raise SplitError(f"layer {name} cannot run {choice.describe()}: {err}") from None

    def fed(self, k: int, known: dict[int, Layout]) -> tuple[Layout, ...]:
        """What layer ``k``'s inputs arrive on as far as its own layouts go: its first input's
        producer's output (in ``known``); the others give only their shapes (a kind's layouts
        depend on its first input's layout alone)."""
        unplaced = self._unplaced[k]
        return tuple(known[p] if e == 0 and p in known else unplaced[e]
                     for e, p in enumerate(self.net.producers(k)))

    def layer_layouts(self, k: int, fed: tuple[Layout, ...], entry: LayerPlan) -> LayerLayouts:
        """:func:`~hpctrain.plan.placement.layer_layouts` of layer ``k``, made once for all
        layers alike fed alike: the segments of a repeated block, and each branch's layers on
        every group of a net's regions, lay out the same layers again. A refusal is not kept:
        it names its own layer."""
        key = (self._alike_layer[k], self.net.out_shapes[k], fed, entry)
        found = self._laid_out.get(key)
        if found is None:
            found = self._laid_out[key] = layer_layouts(self.net, k, fed, entry, self.batch)
        return found

    def _segment_layouts(self, segment: int, choice: LayerPlan) -> list[LayerLayouts]:
        # the first segment's layers before its head read the input where it is produced
        known: dict[int, Layout] = {-1: self.input_layout(choice)} if segment == 0 else {}
        layouts = []
        for k in self.segments[segment]:
            layouts.append(self.layer_layouts(k, self.fed(k, known), choice))
            known[k] = layouts[-1].output
        return layouts

    def kept_upstream(self, index: int) -> bool:
        """Whether the array that reaches layer ``index`` (when no move intervenes) is kept
        anyway: the input batch, or an output its producer keeps, looked at through views."""
        k = self.net.producers(index)[0]
        while k >= 0 and KINDS[self.net.layers[k].kind].pass_through:
            k = self.net.producers(k)[0]
        return k < 0 or KINDS[self.net.layers[k].kind].keeps_output

    def keeps_input(self, index: int) -> bool:
        """Whether layer ``index`` keeps its input array for the backward."""
        spec = self.net.layers[index]
        return KINDS[spec.kind].keeps_input(spec)

    def input_layout(self, first: LayerPlan) -> Layout:
        """Where the input batch is produced when the first segment takes ``first``: the
        network's rule (:func:`hpctrain.plan.placement.input_layout_for`). Found once per
        choice: every search asks again for each of the first segment's choices."""
        found = self._input_layouts.get(first)
        if found is None:
            found = self._input_layouts[first] = input_layout_for(self.net, first, self.batch,
                                                                  self.procs)
        return found


@lru_cache(maxsize=1024)  # the layers of a net's repeated blocks share their shapes
def whole_degrees(procs: int, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every (degree per axis of ``shape``, replicas) multiplying to ``procs`` that leaves no
    rank without a part of the tensor."""
    return tuple(degrees for degrees in ordered_factorisations(procs, len(shape) + 1)
                 if all(d <= n for d, n in zip(degrees, shape)))


@lru_cache(maxsize=1024)
def balanced_degrees(procs: int, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The splits of :func:`whole_degrees` that are *balanced*: every cut divides its axis
    (even blocks), the spatial degrees do not grow along the axes and the largest is at most
    twice the smallest (the block's surface, which the halos cross, near its least for the
    ranks it takes), and replicas only on a tensor without spatial axes (a linear layer's, as
    the 1.5D ``replicated`` mode). For P = 2ᵏ that leaves one spatial split per number of
    spatial ranks: C(k + 2, 2) splits at most, against C(k + m + 1, m + 1) for m + 2 axes."""
    spatial = len(shape) - 2
    found = []
    for n, c, rest in ordered_factorisations(procs, 3):
        if shape[0] % n or shape[1] % c:
            continue
        if spatial <= 0:
            found.append((n, c, rest))
            continue
        for cut in ordered_factorisations(rest, spatial):
            if (list(cut) == sorted(cut, reverse=True) and cut[0] <= 2 * cut[-1]
                    and all(size % d == 0 for d, size in zip(cut, shape[2:]))):
                found.append((n, c, *cut, 1))
    return tuple(found)


def input_splits(procs: int, shape: tuple[int, ...], channels: int, space: str) -> list[Split]:
    """The splits of a conv or linear layer's input ``channels`` (a reduction, summed in the
    layer) on ``procs`` ranks, its output of ``shape``: each summed by an all-reduce with the
    input digit inside the channels' and outside it (the two orders alternate down a chain),
    and by a reduce-scatter. ``space`` "axes": with every whole split of the output's axes;
    "balanced": with the samples and channels alone, every cut even, and for a convolution
    (``shape`` with spatial axes) with the samples alone: the channel parallelism of Dryden et
    al. (SC'19), its output channels cut only by a reduce-scatter. Cutting a convolution's
    input and output channels both, in two orders, would add some 200 choices per layer at
    4096 ranks, each with an input layout of its own to price moves into, for layers that a
    spatial or output split already serves."""
    found = []
    image = len(shape) > 2
    if space == "axes":  # (degree per output axis, input degree)
        cuts = [(degrees[:-1], degrees[-1])
                for degrees in ordered_factorisations(procs, len(shape) + 1)
                if all(d <= n for d, n in zip(degrees, shape)) and 1 < degrees[-1] <= channels]
    else:
        cuts = [((n, c, *[1] * (len(shape) - 2)), i)
                for n, c, i in ordered_factorisations(procs, 3)
                if i > 1 and not (shape[0] % n or shape[1] % c or channels % i)
                and not (image and c > 1)]
    for degrees, inputs in cuts:
        found.append(Split(degrees, 1, inputs))
        if degrees[1] > 1:
            found.append(Split(degrees, 1, inputs, inputs_outer=True))
        even = space == "axes" or shape[1] % (degrees[1] * inputs) == 0
        if even and degrees[1] * inputs <= shape[1]:
            found.append(Split(degrees, 1, inputs, scatter=True))
    return found
