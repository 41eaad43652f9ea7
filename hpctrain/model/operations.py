"""Everything the compute model times, in one registry: the layer kinds, the optimizer's update
of a layer's shard, and producing a rank's block of the input batch.

Each is an :class:`~hpctrain.cost.work.Operation`: it counts the FLOPs of a
:class:`~hpctrain.cost.work.LocalWork` and makes its kernels, and the compute models count or
time every work through that, whatever operation does it (:mod:`hpctrain.cost.compute`). The
update and the input run the very code that training runs: :func:`hpctrain.kernels.sgd.sgd_update`
and :meth:`hpctrain.data.synthetic.SyntheticData.images`.
"""

from __future__ import annotations

import math
import pkgutil
from collections.abc import Callable
from typing import Any

import hpctrain.kernels
from hpctrain.cost.work import Kernels, LocalWork, Operation, Shape
from hpctrain.model.kinds import KINDS


class Update:
    """The optimizer's update of one layer's shard (``work.x`` is its shape), in the backward:
    weight decay, momentum and the step, 5 operations per parameter."""

    name = "update"

    def flops(self, work: LocalWork) -> tuple[float, float]:
        return 0.0, 5.0 * math.prod(work.x)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any,
                random: Callable[[Shape], Any]) -> Kernels:
        from hpctrain.kernels.sgd import Scratch, sgd_update

        w, g, scratch = random(work.x), xp.ones(work.x, dtype=dtype), Scratch()
        velocity = [None]  # the first call makes it, as an optimizer's first step does

        def step() -> None:
            velocity[0] = sgd_update(xp, w, g, velocity[0], 0.01, 0.9, 5e-4, scratch)

        return (lambda: None), (lambda _: step)


class Input:
    """Producing this rank's block of a synthetic batch (``work.x``), before the forward: the
    counter-based generator, about 30 integer operations per entry."""

    name = "input"

    def flops(self, work: LocalWork) -> tuple[float, float]:
        return 30.0 * math.prod(work.x), 0.0

    def kernels(self, xp: Any, work: LocalWork, dtype: Any,
                random: Callable[[Shape], Any]) -> Kernels:
        from hpctrain.data.synthetic import SyntheticData
        from hpctrain.device.backend import Backend

        data = SyntheticData(Backend(xp, dtype), work.x[1:], 1000, work.x[0], 0)
        whole = tuple((0, n) for n in work.x)
        return (lambda: data.images(0, whole)), (lambda _: lambda: None)


class PixelLoss:
    """A segmentation's loss on this rank's block of logits (``work.x``, ``(n, K, *S)``), the
    per-pixel softmax cross-entropy and its gradient
    (:func:`~hpctrain.kernels.segmentation.pixel_cross_entropy`), about 10 operations per
    logit forward (max, shift, exp, sum, log, argmax) and 3 backward (the softmax less the one-hot,
    times the weight). Its work grows with the pixels; a classifier's loss, a row per sample,
    is not timed."""

    name = "pixel-softmax"

    def flops(self, work: LocalWork) -> tuple[float, float]:
        return 10.0 * math.prod(work.x), 3.0 * math.prod(work.x)

    def kernels(self, xp: Any, work: LocalWork, dtype: Any,
                random: Callable[[Shape], Any]) -> Kernels:
        from hpctrain.kernels.segmentation import pixel_cross_entropy

        logits = random(work.x)
        labels = xp.zeros((work.x[0], *work.x[2:]), dtype=xp.int64)
        return ((lambda: pixel_cross_entropy(xp, logits, labels)),
                (lambda _: lambda: None))  # the gradient is made in the forward's pass


#: The optimizer's update, the input batch and a segmentation's loss, as operations.
UPDATE, INPUT, PIXEL_LOSS = Update(), Input(), PixelLoss()
#: Every operation the compute model times, by name (the layer kinds, the update, the input
#: and the per-pixel loss).
OPERATIONS: dict[str, Operation] = {**KINDS, UPDATE.name: UPDATE, INPUT.name: INPUT,
                                    PIXEL_LOSS.name: PIXEL_LOSS}

#: The modules whose code runs inside a timing; a change to any of them makes old timings stale
#: (see hpctrain.cost.compute.code_version). Every kernel, the module of every class an operation
#: is made of (a pooling kind's window base too), the synthetic data, and the timing itself.
TIMED_MODULES = (
    *sorted(f"hpctrain.kernels.{m.name}" for m in pkgutil.iter_modules(hpctrain.kernels.__path__)),
    *sorted({cls.__module__ for op in OPERATIONS.values() for cls in type(op).__mro__
             if cls.__module__.startswith("hpctrain.")}),
    "hpctrain.data.synthetic", "hpctrain.cost.compute", "hpctrain.cost.work",
    "hpctrain.device.caches",
)
