"""The losses: softmax cross-entropy against class labels, mean squared error against targets,
and the per-pixel softmax cross-entropy of segmentation against label maps.

Each gives the loss summed over the samples given, a count of those right (the correct classes;
none under regression) and the gradient of scale·loss with respect to the outputs. The
per-pixel loss is a weighted mean over the pixels of the whole batch, whose denominator is
summed over ranks first (:mod:`hpctrain.kernels.segmentation`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from hpctrain.kernels.segmentation import pixel_cross_entropy


def softmax_cross_entropy(xp: Any, logits: Any, labels: Any, scale: float,
                          smoothing: float = 0.0) -> tuple[Any, Any, Any]:
    """Summed loss, number correct, and d(scale·loss)/dlogits for logits: (N, K), labels: (N,).

    loss = Σ_n [log Σ_k exp z_nk − z_n,y_n]; the gradient is scale·(softmax(z) − onehot(y)).
    With label smoothing ε (PyTorch's ``CrossEntropyLoss(label_smoothing=ε)``) the target is
    (1 − ε)·onehot(y) + ε/K: loss = Σ_n [(1 − ε)·CE_n + (ε/K)·Σ_k (log Σ_j exp z_nj − z_nk)],
    and the gradient scale·(softmax(z) − (1 − ε)·onehot(y) − ε/K).
    """
    z = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(z)
    total = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(len(labels))
    log_total = xp.log(total[:, 0])
    loss_sum = (log_total - z[rows, labels]).sum()
    correct = (logits.argmax(axis=1) == labels).sum()
    grad = exp / total
    if smoothing:
        classes = z.shape[1]
        spread = (classes * log_total - z.sum(axis=1)).sum()
        loss_sum = (1 - smoothing) * loss_sum + smoothing / classes * spread
        grad[rows, labels] -= 1.0 - smoothing
        grad -= smoothing / classes
    else:
        grad[rows, labels] -= 1.0
    return loss_sum, correct, grad * scale


def mean_squared_error(xp: Any, outputs: Any, targets: Any, scale: float
                       ) -> tuple[Any, Any, Any]:
    """Summed loss, 0, and d(scale·loss)/doutputs for outputs and targets: (N, T).

    A sample's loss is the mean over its T targets of (y − t)², as Keras's and PyTorch's
    ``mean_squared_error`` over a batch of one; the gradient is scale·2(y − t)/T.
    """
    error = outputs - targets
    width = outputs.shape[1]
    loss_sum = (error * error).sum() / width
    return loss_sum, xp.zeros((), dtype=xp.int64), error * (2.0 * scale / width)


@dataclass(frozen=True)
class Loss:
    """A net's loss: its name in a plan's loss row, its ``function(xp, outputs, answers,
    scale)`` above, and whether it classifies (its count of correct answers is an accuracy).

    ``per_pixel``: a segmentation's loss, over logits ``(N, K, *S)`` and label maps
    ``(N, *S)``, with
    class ``weights`` (None: all 1); its ``function`` gives the weighted sum and the gradient
    of scale·(weighted sum), and the network divides both by the global weight sum.
    ``smoothing``: the label smoothing ε of a cross-entropy (``--label-smoothing``; 0: none).

    A held-out split is padded to whole batches, with label -1 or a row of NaN targets:
    :meth:`real` marks the answers that are not padding."""

    name: str
    function: Callable[[Any, Any, Any, float], tuple[Any, Any, Any]]
    classifies: bool
    per_pixel: bool = False
    weights: tuple[float, ...] | None = None
    smoothing: float = 0.0

    def real(self, xp: Any, answers: Any) -> Any:
        """Which of ``answers`` (labels (N,), or targets (N, T)) are a sample's."""
        return answers >= 0 if self.classifies else ~xp.isnan(answers).any(axis=1)


def pixel_loss(weights: tuple[float, ...] | None = None, smoothing: float = 0.0) -> Loss:
    """The per-pixel softmax cross-entropy with class ``weights`` (None: all 1) and label
    ``smoothing``."""
    def function(xp: Any, logits: Any, labels: Any, scale: float) -> tuple[Any, Any, Any]:
        loss_sum, _, correct, _, grad = pixel_cross_entropy(xp, logits, labels, weights,
                                                            smoothing)
        return loss_sum, correct, grad * scale

    return Loss("pixel-softmax", function, classifies=True, per_pixel=True, weights=weights,
                smoothing=smoothing)


def cross_entropy(smoothing: float = 0.0) -> Loss:
    """The softmax cross-entropy against class labels, with label ``smoothing``."""
    if not smoothing:
        return CROSS_ENTROPY
    return Loss("softmax", partial(softmax_cross_entropy, smoothing=smoothing),
                classifies=True, smoothing=smoothing)


CROSS_ENTROPY = Loss("softmax", softmax_cross_entropy, classifies=True)
MEAN_SQUARED_ERROR = Loss("mse", mean_squared_error, classifies=False)
