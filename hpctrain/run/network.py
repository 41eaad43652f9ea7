"""A network under a per-layer plan: layers, the redistributions between them, and the loss."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.comm.agree import agreed, on_root
from hpctrain.comm.collectives import allreduce_sum
from hpctrain.comm.gather import block_from_root
from hpctrain.comm.gradients import GradientReducer
from hpctrain.comm.grid import GridSet
from hpctrain.comm.redistribute import Redistribute
from hpctrain.comm.transport import group_of
from hpctrain.cost.machine import BUCKET_BYTES
from hpctrain.data.source import DataSource, HeldOutSource
from hpctrain.device.backend import Backend
from hpctrain.errors import UserError
from hpctrain.interchange.weights import fresh_layers, read_weights
from hpctrain.kernels.counter_rng import stream_key
from hpctrain.kernels.products import widen
from hpctrain.kernels.segmentation import PixelTotals, class_counts, pixel_cross_entropy
from hpctrain.layers.base import Absent, BuildContext, Layer, Parameter
from hpctrain.layout.layout import Layout, grid_coords
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetSpec, StartingWeights
from hpctrain.plan.placement import input_layout, move_pairs, plan_layouts, schedule
from hpctrain.plan.plans import LayerPlan, PlanError
from hpctrain.record.timing import IN_FLIGHT, LOSS, StepTimer, StepTimes


@dataclass
class Overflow:
    """Where the values of one step stopped being finite on this rank: the first layer whose
    output holds NaN or Inf in the forward, and the first layer, from the loss down, whose
    gradients (the one reaching its output, its parameters', its input's) do in the backward.

    Pass one to :meth:`Network.train_step` to have it filled. Each check is a pass over an
    array (and, on a GPU, a wait for it), so the training loop watches only its first step:
    there no update has happened yet, and a value that overflows says the net (an option such
    as a scale factor, its initial weights), not the learning rate, is the cause.
    """

    xp: Any
    forward: int | None = None  # the layer's index, or None: every output finite
    backward: int | None = None

    def see_output(self, k: int, y: Any) -> None:
        """Layer ``k`` made ``y`` in the forward."""
        if self.forward is None and not _finite(self.xp, [y]):
            self.forward = k

    def see_gradients(self, k: int, arrays: list) -> None:
        """Layer ``k``'s gradients in the backward (None entries, and lists of one per input,
        allowed)."""
        if self.backward is None and not _finite(self.xp, arrays):
            self.backward = k

    def over_ranks(self, comm: Any) -> tuple[int | None, int | None]:
        """(first forward layer, first backward layer) over every rank of ``comm``: the lowest
        index in the forward, the highest in the backward, which runs from the loss down.
        Collective."""
        from mpi4py import MPI

        none = 2**31 - 1  # a C int's largest: no layer
        first = comm.allreduce(none if self.forward is None else self.forward, op=MPI.MIN)
        last = comm.allreduce(-1 if self.backward is None else self.backward, op=MPI.MAX)
        return (None if first == none else first), (None if last < 0 else last)


def _finite(xp: Any, arrays: list) -> bool:
    """Whether every entry of every array of ``arrays`` (nested lists, None skipped) is finite."""
    for a in arrays:
        if isinstance(a, list | tuple):
            if not _finite(xp, list(a)):
                return False
        elif a is not None and not bool(xp.isfinite(a).all()):
            return False
    return True


class Network:
    """``net`` on the ranks of ``grids.world``, each layer on the grid its plan entry names.

    Every edge whose producer and consumer layouts differ gets a
    :class:`~hpctrain.comm.redistribute.Redistribute`, which moves activations forward and gradients
    back. A tensor read by several layers gets the sum of the gradients that come back. Parameter
    gradients are summed over the ranks holding the same shard in buckets of ``bucket_bytes``;
    with ``overlap``, in flight while the backward goes on
    (:class:`~hpctrain.comm.gradients.GradientReducer`).
    After the last layer the logits are replicated over the
    last grid's Pr ranks; in each batch group the rank with i = 0 owns the loss of its samples,
    so each sample's loss (and gradient) is counted exactly once. A segmentation net's logits
    keep their cut pixels (:func:`~hpctrain.plan.placement.loss_layout`): each rank reads its
    block of the label maps, and copy 0 of each block owns the loss of its pixels.

    Groups of ranks: a layer whose layouts lie on a group this rank is not in is an
    :class:`~hpctrain.layers.base.Absent` here, and the moves this rank neither sends nor
    receives in are skipped; every rank runs the steps it takes part in in the one order of
    :func:`~hpctrain.plan.placement.schedule` (forward; the backward reversed), which is what
    keeps concurrent groups free of deadlock.

    Timing: pass a record from :meth:`step_times` as ``times`` to :meth:`train_step` (or to
    :meth:`forward`, :meth:`loss` and :meth:`backward`) and it is filled with each layer's
    compute, its own communication and the redistributions feeding it, forward and backward.
    Timing changes no numbers; without a record nothing is timed.
    """

    def __init__(self, net: NetSpec, plan: list[LayerPlan], batch: int, grids: GridSet,
                 backend: Backend, seed: int = 0, overlap: bool = False,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        if len(plan) != len(net.layers):
            raise PlanError(f"plan has {len(plan)} entries but net {net.name} has "
                            f"{len(net.layers)} layers")
        self.net, self.plan, self.batch = net, plan, batch
        self.grids, self.backend = grids, backend
        self.rank = grids.world.Get_rank()
        procs = grids.world.Get_size()
        # every layout from the plan alone (placement.py), once; the move benchmark plans the
        # very moves that run
        self.input_layout = input_layout(net, plan, batch, procs)
        layouts = plan_layouts(net, plan, batch, procs)
        if any(where.output.on_group for where in layouts):
            group_of(backend, grids.world)  # under NCCL made by every rank, before any skips
        self.layers: list[Layer] = []
        for k, (spec, entry, where) in enumerate(zip(net.layers, plan, layouts, strict=True)):
            if where.output.holds(self.rank):
                context = BuildContext(entry.mode, entry.grid, where.inputs, where.output,
                                       grids, backend, stream_key(seed, k), self.rank)
                layer = KINDS[spec.kind].build(spec, context)
            else:
                kind, shapes = KINDS[spec.kind], net.in_shapes(k)
                layer = Absent(spec.name, where.inputs, where.output,
                               kind.param_shapes(spec, shapes), kind.buffer_shapes(spec, shapes),
                               backend)
            layer.need_dx = net.reads_layers(k)  # nobody reads the input batch's gradient
            self.layers.append(layer)
        *feeding, (last, self.loss_layout) = move_pairs(net, layouts, self.input_layout)
        # moves[k][e] feeds input e of layers[k]; None where this rank takes no part in it
        pairs = iter(feeding)
        self.moves = [[self._move(*next(pairs)) for _ in spec.inputs] for spec in net.layers]
        self.to_loss = Redistribute(backend, grids, last, self.loss_layout)
        self.order = schedule(net, layouts, self.input_layout)
        # (move, producer) per input of each layer, and the outputs free after each step: those
        # whose last reader it is, in the schedule's order
        self.feeds = [list(zip(self.moves[k], net.producers(k), strict=True))
                      for k in range(len(net.layers))]
        last_read: dict[int, int] = {}
        for i, step in enumerate(self.order):
            if step.input is not None:
                last_read[net.producers(step.layer)[step.input]] = i
        self.frees: list[list[int]] = [[] for _ in self.order]
        for p, i in last_read.items():
            self.frees[i].append(p)
        self.input_box = self.input_layout.box(self.rank)  # this rank's block of each batch
        loss_box = self.loss_layout.box(self.rank)
        if net.per_pixel:
            # the block of the label maps (N, *S) its logits (N, K, *S) score: its samples and
            # its pixels (a domain split's rows stay cut); copy 0 of each block owns its loss
            self.labels_box: Any = (loss_box[0], *loss_box[2:])
            self.owns_loss = self.loss_layout.replica_index(self.rank) == 0
        else:
            self.labels_box = loss_box[0]  # the samples of its loss
            # in each batch group the rank with i = 0 owns its samples' loss (the class doc)
            self.owns_loss = grid_coords(self.rank, self.loss_layout.grid)[0] == 0
        self.gradient_sums = GradientReducer(backend, bucket_bytes, in_flight=overlap)
        # each parameter's sum of its micro-batches' gradients (id → array), under accumulation
        self._accumulated: dict[int, Any] = {}
        if net.weights is not None:
            self.load_weights(net.weights)

    def load_weights(self, source: StartingWeights) -> None:
        """Every parameter and buffer (but those of ``source.fresh`` layers, which keep the
        seed's) from the file ``source`` names: rank 0 reads and matches it
        (:func:`~hpctrain.interchange.weights.read_weights`, refusals on every rank), then
        each tensor is broadcast whole and every rank keeps its own block of it, under any plan
        and P. Collective; rank 0 holds the file's tensors, every other rank one at a time."""
        world = self.grids.world
        found = on_root(world, lambda: read_weights(source, self.net))
        fresh = fresh_layers(self.net, source.fresh)[0]
        master = self.backend.precision.master
        for tensors, trained in ((self.params, True), (self.buffers, False)):
            for tensor in tensors:
                if tensor.name.rpartition(".")[0] in fresh:
                    continue
                block = self.backend.xp.asarray(block_from_root(
                    world, None if found is None else found[tensor.name], tensor.shape,
                    tensor.box(self.rank), master))
                if trained:
                    tensor.set_weights(block)
                else:
                    tensor.value[...] = block

    def _move(self, src: Layout, dst: Layout) -> Redistribute | None:
        """The redistribution from ``src`` to ``dst``, or None where this rank holds a block of
        neither (it takes no part)."""
        if not (src.holds(self.rank) or dst.holds(self.rank)):
            return None
        return Redistribute(self.backend, self.grids, src, dst)

    def _held(self, k: int) -> bool:
        """Whether this rank runs layer ``k`` (it is in the layer's group)."""
        return self.layers[k].out_layout.holds(self.rank)

    def _nothing(self, layout: Layout, like: Any) -> Any:
        """Zeros in this rank's block of ``layout`` (an empty block outside the layout's group),
        in the dtype of ``like``."""
        return self.backend.xp.zeros(layout.local_shape(self.rank), dtype=like.dtype)

    @property
    def params(self) -> list[Parameter]:
        return [p for layer in self.layers for p in layer.params]

    @property
    def buffers(self) -> list[Parameter]:
        """State kept with the parameters but not trained (batch norm's running statistics)."""
        return [b for layer in self.layers for b in layer.buffers]

    def set_training(self, training: bool) -> None:
        """Training (dropout on, batch statistics) or evaluation (dropout off, running
        statistics, settled first). Collective when it turns evaluation on."""
        if not training:
            self.settle_buffers()
        for layer in self.layers:
            layer.training = training

    def settle_buffers(self) -> None:
        """Make every rank's buffers agree (:meth:`~hpctrain.layers.base.Layer.settle`), as a
        checkpoint, an evaluation or a comparison reads them. Collective."""
        for layer in self.layers:
            layer.settle()

    def step_times(self) -> StepTimes:
        """A blank timing record for one step of this network (one row per layer)."""
        return StepTimes.blank([layer.name for layer in self.layers])

    def forward(self, x: Any, step: int, trace: list | None = None,
                times: StepTimes | None = None, watch: Overflow | None = None) -> Any:
        """Logits on ``loss_layout`` from X on ``input_layout``; ``trace`` collects each output.

        ``times`` (from :meth:`step_times`) is filled with each move's and layer's forward time.
        An output is let go once every layer reading it has run. ``watch`` is told of each
        output (see :class:`Overflow`).
        """
        outputs: dict[int, Any] = {-1: x}
        moved: dict[tuple[int, int], Any] = {}  # the inputs of layers not yet run
        traced: dict[int, Any] = {}
        with StepTimer(self.backend, times) as timer:
            for i, op in enumerate(self.order):
                k = op.layer
                if op.input is not None:
                    move, p = self.feeds[k][op.input]
                    if move is not None:
                        src = outputs[p] if p in outputs else self._nothing(move.src, x)
                        y = move.forward(src)
                        if self._held(k):
                            moved[k, op.input] = y
                        timer.forward_move(k, move)
                elif self._held(k):
                    xs = [moved.pop((k, e)) for e in range(len(self.feeds[k]))]
                    y = self.layers[k].forward(xs if len(xs) > 1 else xs[0], step)
                    timer.forward_layer(k)
                    if watch is not None:
                        watch.see_output(k, y)
                    outputs[k] = y
                if op.input is None and trace is not None:
                    traced[k] = outputs[k] if k in outputs else self._nothing(
                        self.layers[k].out_layout, x)
                for p in self.frees[i]:
                    outputs.pop(p, None)
            logits = self.to_loss.forward(outputs[len(self.layers) - 1])
            timer.forward_move(LOSS, self.to_loss)
        if trace is not None:
            trace.extend(traced[k] for k in range(len(self.layers)))
        return logits

    def backward(self, dlogits: Any, trace: list | None = None,
                 times: StepTimes | None = None,
                 update: Callable[[list[Parameter]], None] | None = None,
                 output_grads: list | None = None, watch: Overflow | None = None,
                 micro: tuple[int, int] = (0, 1)) -> None:
        """Parameter gradients from dLoss/dlogits, summed over the ranks that share each
        shard; ``trace`` collects each layer's input gradient (a list of one per input for a
        layer of several inputs), ``output_grads`` the gradient that reached each layer's
        output (summed over the layers that read it).

        ``micro``: (j, K), this backward is micro-batch j of K of a step that accumulates
        gradients. Each rank adds its own gradients of micro-batches 0..K-1 in order
        (g₀ + g₁ + … as one process accumulating would), and only the last micro-batch's
        backward sums them over ranks and hands them to ``update``: one sum per step,
        however many micro-batches.

        Each layer's parameter gradients start on their way as soon as its backward has made
        them; ``update(params)`` (the optimizer) runs for each group as soon as its sum has
        arrived, during the backward or while the last sums are awaited at its end. ``times``
        (from :meth:`step_times`) is filled with each layer's and move's backward time; the
        first layer's also holds that final wait, and the updates made then. ``watch`` is told
        of each layer's gradients before their sums start (see :class:`Overflow`).
        """
        grads: dict[int, Any] = {}
        sums = self.gradient_sums
        index, micro_batches = micro
        last_micro = index == micro_batches - 1
        if last_micro:
            sums.start(update)
        timeline = times is not None and times.spans is not None
        sums.flights = [] if timeline else None
        input_grads: dict[tuple[int, int], Any] = {}  # of layers run, for their moves
        traced: dict[int, Any] = {}
        reached: dict[int, Any] = {}
        with StepTimer(self.backend, times) as timer:
            grads[len(self.layers) - 1] = self.to_loss.backward(dlogits)
            timer.backward_move(LOSS, self.to_loss)
            for op in reversed(self.order):
                k = op.layer
                if op.input is not None:
                    self._move_back(k, op.input, input_grads, grads, dlogits, timer)
                    continue
                layer = self.layers[k]
                if not self._held(k):
                    if trace is not None:
                        traced[k] = [self._nothing(x, dlogits) for x in layer.in_layouts]
                        if len(traced[k]) == 1:
                            traced[k] = traced[k][0]
                    reached[k] = self._nothing(layer.out_layout, dlogits)
                    continue
                dy = grads.pop(k)
                reached[k] = dy
                dxs = layer.backward(dy)
                if watch is not None:  # before the sums, which may then be in flight
                    watch.see_gradients(k, [dy, *(p.grad for p in layer.params), dxs])
                if micro_batches > 1:
                    self._accumulate(layer.params, index, last_micro)
                if last_micro:
                    for comm, params in layer.gradient_groups():
                        sums.add(comm, params, k)
                    sums.progress()  # between kernels: MPI moves the sums on only when called
                    if k == 0:
                        sums.finish()
                timer.backward_layer(k)
                if trace is not None:
                    traced[k] = dxs
                for e, dx in enumerate(dxs if len(self.feeds[k]) > 1 else [dxs]):
                    input_grads[k, e] = dx
            if not self._held(0) and last_micro:
                sums.finish()
        if trace is not None:
            trace[:0] = [traced[k] for k in range(len(self.layers))]
        if output_grads is not None:
            output_grads[:0] = [reached[k] for k in range(len(self.layers))]
        if timeline:
            times.spans += [(row, 1, IN_FLIGHT, sent, arrived)
                            for row, sent, arrived in sums.flights]

    def _accumulate(self, params: list[Parameter], index: int, last: bool) -> None:
        """Add the gradients micro-batch ``index`` left in ``params`` to this rank's running
        sums of the step (micro-batch 0 starts them); after the step's ``last`` micro-batch
        each ``Parameter.grad`` is the sum, still to be summed over ranks. 16-bit gradients
        (bf16, fp16) are added in float32 and rounded to 16 bits once, at the last."""
        master = self.backend.precision.master
        for p in params:
            wide = master if p.grad.dtype.itemsize < np.dtype(master).itemsize else p.grad.dtype
            kept = self._accumulated.get(id(p))
            if kept is None or kept.shape != p.grad.shape or kept.dtype != wide:
                kept = self._accumulated[id(p)] = p.grad.astype(wide)
            elif index == 0:
                kept[...] = p.grad
            else:
                kept += p.grad
            if last and kept.dtype == p.grad.dtype:
                p.grad = kept
            elif last:  # rounded once, into the layer's own gradient of this micro-batch
                p.grad[...] = kept

    def _move_back(self, k: int, e: int, input_grads: dict, grads: dict, like: Any,
                   timer: StepTimer) -> None:
        """The backward of the move into input ``e`` of layer ``k``: the gradient layer ``k``
        left for it (nothing where this rank is outside the layer's group) back to the
        producer's layout, added into the producer's output gradient where this rank runs the
        producer."""
        move, p = self.feeds[k][e]
        dx = input_grads.pop((k, e), None)
        if move is None or p < 0:
            return  # no part in it, or the input batch
        if dx is None:  # outside the layer's group (an empty block), or no gradient: zeros
            dx = self._nothing(move.dst, like)
        dy = move.backward(dx)
        self.gradient_sums.progress()
        timer.backward_move(k, move)
        if self._held(p):
            grads[p] = dy if p not in grads else grads[p] + dy

    def train_step(self, data: DataSource, step: int, outputs: list | None = None,
                   input_grads: list | None = None, times: StepTimes | None = None,
                   update: Callable[[list[Parameter]], None] | None = None,
                   output_grads: list | None = None,
                   watch: Overflow | None = None,
                   loss_scale: float = 1.0, accumulate: int = 1) -> tuple[float, float]:
        """Forward, loss and backward on batch ``step`` of ``data``: (mean loss, accuracy).

        ``accumulate`` K > 1: ``data`` gives micro-batches of this network's batch
        (:class:`~hpctrain.data.source.MicroBatches`), and the step is the K micro-batches
        ``step``·K … ``step``·K + K − 1, one forward and backward each, their gradients added
        on each rank and summed over ranks once, after the last (:meth:`backward`). Each
        micro-batch's loss counts 1/K: the gradient is that of the mean of the micro-batches'
        losses, as PyTorch's ``(loss / K).backward()`` per micro-batch (for a classifier, the
        mean over all K·batch samples); batch norm normalises each micro-batch by its own
        statistics and updates its running ones once per micro-batch, as PyTorch's does. The
        loss and accuracy returned are the means over the micro-batches; ``outputs``,
        ``input_grads`` and ``output_grads`` are the last micro-batch's.

        Each rank reads only its own block of the batch. ``outputs``, ``input_grads`` and
        ``output_grads`` collect every layer's output, input gradient and output gradient (for
        verification). ``times`` (from
        :meth:`step_times`) is filled with this rank's per-layer times, the whole step's and the
        time spent waiting for the step's data (``StepTimes.data``).
        ``update``: see :meth:`backward`; without it every summed gradient is left in
        ``Parameter.grad`` for an optimizer step after this one. ``watch``: see
        :class:`Overflow`. ``loss_scale``: what the loss is multiplied by before the backward
        (fp16's loss scaling): every gradient comes out that many times larger.
        """
        if accumulate < 1:
            raise ValueError(f"accumulate {accumulate}: give 1 or more micro-batches")
        loss = accuracy = 0.0
        with StepTimer(self.backend, times) as timer:
            for j in range(accumulate):
                last = j == accumulate - 1
                batch = step * accumulate + j
                with timer.reading():
                    x = data.images(batch, self.input_box)
                logits = self.forward(x, batch, outputs if last else None, times, watch)
                with timer.reading():
                    labels = data.labels(batch, self.labels_box)
                part, right, dlogits = self.loss(logits, labels, times, data,
                                                 loss_scale / accumulate)
                loss, accuracy = loss + part, accuracy + right
                del logits, x
                self.backward(dlogits, input_grads if last else None, times,
                              update, output_grads if last else None, watch,
                              micro=(j, accumulate))
            timer.finish_step()
        return loss / accumulate, accuracy / accumulate

    def loss(self, logits: Any, labels: Any, times: StepTimes | None = None,
             data: DataSource | None = None, scale: float = 1.0) -> tuple[float, float, Any]:
        """Mean loss and accuracy over the global batch, and dLoss/dlogits for this rank
        (the accuracy is 0 under regression).

        ``labels`` are the labels (or targets) of this rank's batch shard in ``loss_layout``.
        ``times`` gets the loss as the loss row's compute and the all-reduce of the totals as
        its comm.
        ``data``, the source of the batch: whether any rank read NaN or Inf from it rides on
        the same all-reduce, and then every rank raises (see :meth:`refuse_nonfinite`).
        ``scale`` multiplies the gradient (not the loss returned): fp16's loss scale.

        16-bit logits are widened: the loss and its gradient are made in float32, and the
        gradient is scaled before it is rounded to 16 bits, so small gradients survive.
        """
        if self.net.per_pixel:
            return self._pixel_loss(logits, labels, times, data, scale)
        xp = self.backend.xp
        with StepTimer(self.backend, times) as timer:
            loss_sum, correct, grad = self.net.loss.function(xp, widen(logits), labels,
                                                             scale / self.batch)
            grad = grad.astype(logits.dtype, copy=False)
            if not self.owns_loss:  # a replica: the owner (i = 0) counts these samples
                loss_sum, correct, grad = loss_sum * 0, correct * 0, grad * 0
            totals = xp.stack([xp.asarray(loss_sum, dtype=xp.float64),
                               xp.asarray(correct, dtype=xp.float64),
                               xp.asarray(_read_nonfinite(data), dtype=xp.float64)])
            totals = self.backend.to_numpy(allreduce_sum(self.backend, self.grids.world, totals))
            timer.forward_layer(LOSS)
        self.refuse_nonfinite(totals[2], data)
        return float(totals[0]) / self.batch, float(totals[1]) / self.batch, grad

    def _pixel_loss(self, logits: Any, labels: Any, times: StepTimes | None,
                    data: DataSource | None, scale: float) -> tuple[float, float, Any]:
        """:meth:`loss` of a segmentation net: the weighted mean over every counted pixel of
        the global batch, Σ w CE / Σ w, and the pixel accuracy.

        Each rank sums its own block of pixels (a replica's sums are zeros); one all-reduce
        carries the sums, the global weight sum among them, and only then is this rank's
        gradient divided by it, so loss and gradient are one process's up to float order."""
        xp = self.backend.xp
        with StepTimer(self.backend, times) as timer:
            loss_sum, weight_sum, correct, counted, grad = pixel_cross_entropy(
                xp, widen(logits), labels, self.net.loss.weights, self.net.loss.smoothing)
            sums = [loss_sum, weight_sum, correct, counted]
            if not self.owns_loss:  # a replica: copy 0 of this block counts these pixels
                sums = [0.0] * 4
            totals = xp.stack([*(xp.asarray(v, dtype=xp.float64) for v in sums),
                               xp.asarray(_read_nonfinite(data), dtype=xp.float64)])
            totals = self.backend.to_numpy(allreduce_sum(self.backend, self.grids.world, totals))
            weights = float(totals[1])
            factor = scale / weights if self.owns_loss and weights > 0 else 0.0
            grad = (grad * factor).astype(logits.dtype, copy=False)
            timer.forward_layer(LOSS)
        self.refuse_nonfinite(totals[4], data)
        loss = float(totals[0]) / weights if weights > 0 else 0.0
        return loss, float(totals[2]) / max(float(totals[3]), 1.0), grad

    def refuse_nonfinite(self, ranks_flagged: float, data: DataSource | None) -> None:
        """Raise a :class:`~hpctrain.errors.UserError` on every rank when ``ranks_flagged`` (the
        all-reduced count of ranks that read NaN or Inf, the same on every rank) is not 0: an
        agreement carries the first such rank's description of the sample to all. Collective
        then."""
        if not ranks_flagged:
            return

        def check() -> None:
            if _read_nonfinite(data):
                raise UserError(data.nonfinite)

        agreed(self.grids.world, check, everywhere=True)
        raise UserError("an input batch held NaN or Inf; check the data")  # not reached

    def evaluate(self, data: HeldOutSource, batch: int) -> tuple[float, int, int]:
        """Summed loss, number correct and number of real samples in held-out batch ``batch``.

        Dropout is off. ``data`` marks padding past the end of the split with label -1 (or
        targets of NaN); those samples are not counted. Collective; every rank gets the global
        totals. A segmentation net counts pixels (:meth:`evaluate_pixels`): its summed loss
        is then the weighted mean times the pixels counted.
        """
        if self.net.per_pixel:
            totals = self.evaluate_pixels(data, batch)
            return totals.loss * totals.counted, totals.correct, totals.counted
        xp = self.backend.xp
        logits, labels = self._held_out_logits(data, batch)
        real = self.net.loss.real(xp, labels)
        totals = xp.zeros(4, dtype=xp.float64)
        if self.owns_loss and bool(real.any()):
            loss_sum, correct, _ = self.net.loss.function(xp, widen(logits[real]),
                                                          labels[real], 1.0)
            totals[0], totals[1], totals[2] = loss_sum, correct, real.sum()
        totals[3] = _read_nonfinite(data)
        totals = self.backend.to_numpy(allreduce_sum(self.backend, self.grids.world, totals))
        self.refuse_nonfinite(totals[3], data)
        return float(totals[0]), int(round(totals[1])), int(round(totals[2]))

    def _held_out_logits(self, data: HeldOutSource, batch: int) -> tuple[Any, Any]:
        """This rank's logits of held-out batch ``batch`` with dropout off and the running
        statistics used, and its block of the batch's labels."""
        x = data.images(batch, self.input_box)
        self.set_training(False)
        try:
            logits = self.forward(x, step=0)
        finally:
            self.set_training(True)
        return logits, data.labels(batch, self.labels_box)

    def evaluate_pixels(self, data: HeldOutSource, batch: int) -> PixelTotals:
        """:meth:`evaluate` of a segmentation net: the sums over every counted pixel of
        held-out batch ``batch`` (weighted loss and weights, correct and counted pixels, each
        class's intersection and union), over every rank. Padding past the end of the split
        is labelled −1 at every pixel, and not counted. Collective."""
        xp = self.backend.xp
        logits, labels = self._held_out_logits(data, batch)
        classes = self.net.classes
        mine = PixelTotals(classes)
        if self.owns_loss and labels.size:
            loss_sum, weight_sum, correct, counted, _ = pixel_cross_entropy(
                xp, widen(logits), labels, self.net.loss.weights, self.net.loss.smoothing)
            both, union = class_counts(xp, logits, labels)
            mine = PixelTotals(classes, float(loss_sum), float(weight_sum), int(correct),
                               int(counted), self.backend.to_numpy(both),
                               self.backend.to_numpy(union))
        vector = xp.asarray(np.append(mine.vector(), _read_nonfinite(data)))
        vector = self.backend.to_numpy(allreduce_sum(self.backend, self.grids.world, vector))
        self.refuse_nonfinite(vector[-1], data)
        return PixelTotals.of_vector(classes, vector[:-1])


def _read_nonfinite(data: DataSource | None) -> float:
    """1.0 when ``data`` noted a NaN or Inf in a block this rank read, else 0.0."""
    return 1.0 if data is not None and data.nonfinite else 0.0
