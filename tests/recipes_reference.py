"""Gradient accumulation and label smoothing against PyTorch, float64, step by step.

:func:`hpctrain_accumulating` trains hpctrain's network on any communicator under any plan,
K micro-batches per step (``Network.train_step(accumulate=K)``, the code the training loop
runs) with label smoothing S, and gathers every tensor whole on rank 0. :func:`torch_accumulating`
trains the PyTorch twin from the same initial values on the same batches the way a PyTorch user
accumulates: ``zero_grad``; per micro-batch ``(criterion(model(x_j), y_j) / K).backward()``;
then one ``optimizer.step()``, with ``CrossEntropyLoss(label_smoothing=S)`` (and class weights
and ``ignore_index=-1`` for a segmentation's per-pixel loss).

Import this module only after ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

from hpctrain.data.synthetic import SyntheticData
from hpctrain.model.net import NetSpec, parse_net
from hpctrain.plan.plans import LayerPlan
from tests.torch_reference import (
    BN_CNN_NET,
    LR,
    MOMENTUM,
    WEIGHT_DECAY,
    BatchNormCNN,
    NameMap,
    Run,
    StepResult,
    batchnorm_cnn_names,
    hpctrain_steps,
    started_as,
)

STEPS = 3
TOLERANCE = 1e-9  # relative error of every tensor of every step

SEGMENT_NET = """input channels=2 size=6 classes=3
conv out=4 kernel=3 pad=1
relu
conv name=head out=3 kernel=1
"""
CLASS_WEIGHTS = (1.0, 2.5, 0.5)


class SegmentCNN(nn.Module):
    """SEGMENT_NET: a 3x3 conv, ReLU, a 1x1 conv giving 3 class scores per pixel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.head = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.conv1(x)))


def segment_names() -> NameMap:
    names = NameMap({}, {})
    names.conv("conv1", "conv1", bias=True)
    names.conv("head", "head", bias=True)
    return names


class Unlabelled:
    """``source``'s label maps with about one pixel in five not counted (−1), chosen by the
    pixel's place in the whole batch, so every block agrees with the whole."""

    def __init__(self, source: SyntheticData) -> None:
        self.source, self.nonfinite = source, None

    def images(self, step, box):
        return self.source.images(step, box)

    def labels(self, step, box):
        maps = self.source.labels(step, box)
        grids = np.meshgrid(*(np.arange(lo, hi) for lo, hi in box), indexing="ij")
        return np.where((3 * grids[0] + grids[1] * 7 + grids[2] * 5 + step) % 5 == 0, -1, maps)


CASES = {  # name → (net, PyTorch model, name map, class weights)
    "bn_cnn": (lambda: parse_net(BN_CNN_NET, "bn_cnn"), lambda: BatchNormCNN(10),
               batchnorm_cnn_names, None),
    "segment": (lambda: parse_net(SEGMENT_NET, "segment"), SegmentCNN, segment_names,
                CLASS_WEIGHTS),
}


def hpctrain_accumulating(net: NetSpec, plan: list[LayerPlan], comm: MPI.Comm, batch: int,
                          accumulate: int, smoothing: float = 0.0, steps: int = STEPS
                          ) -> Run | None:
    """``steps`` steps of hpctrain in float64 on ``comm`` under ``plan`` (planned for the
    micro-batch ``batch / accumulate``), each of ``accumulate`` micro-batches and one SGD
    update, with label smoothing ``smoothing`` and, per pixel, some pixels unlabelled;
    everything gathered whole on rank 0 (None elsewhere). Collective."""
    net = net.with_label_smoothing(smoothing)
    return hpctrain_steps(net, plan, comm, batch, steps, accumulate,
                          Unlabelled if net.per_pixel else None)


def torch_accumulating(model: nn.Module, names: NameMap, start: Run, accumulate: int,
                       smoothing: float = 0.0, weights: tuple[float, ...] | None = None
                       ) -> list[StepResult]:
    """The PyTorch model, float64, from ``start``'s initial values, on ``start``'s batches:
    per step, ``accumulate`` micro-batches each adding the gradient of
    ``CrossEntropyLoss(weight, ignore_index=-1, label_smoothing)(…) / accumulate``, then one
    ``torch.optim.SGD`` step. The logits kept are the last micro-batch's."""
    model = started_as(model, names, start)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, dampening=0.0,
                                weight_decay=WEIGHT_DECAY, nesterov=False)
    criterion = nn.CrossEntropyLoss(
        weight=None if weights is None else torch.tensor(weights, dtype=torch.float64),
        ignore_index=-1, label_smoothing=smoothing)
    results = []
    for images, labels in start.batches:
        optimizer.zero_grad(set_to_none=True)
        micro = len(images) // accumulate
        total = 0.0
        for j in range(accumulate):
            part = slice(j * micro, (j + 1) * micro)
            logits = model(torch.from_numpy(images[part]))
            loss = criterion(logits, torch.from_numpy(labels[part])) / accumulate
            loss.backward()
            total += float(loss.detach())
        grads = {ours: params[theirs].grad.numpy().copy() for ours, theirs in names.params.items()}
        optimizer.step()
        results.append(StepResult(
            logits.detach().numpy().copy(), total, grads,
            {ours: params[theirs].detach().numpy().copy()
             for ours, theirs in names.params.items()},
            {ours: buffers[theirs].numpy().copy() for ours, theirs in names.buffers.items()}))
    return results
