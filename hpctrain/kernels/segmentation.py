"""Segmentation: the per-pixel softmax cross-entropy and the counts its metrics are made of.

A segmentation net gives K logits per pixel, (n, K, H, W) or (n, K, D, H, W), trained towards
label maps (n, H, W) or (n, D, H, W) of classes in [0, K); a negative label (−1) marks a pixel
that is not counted (unlabelled, or padding), as PyTorch's ``ignore_index``. With class weights
w the loss is PyTorch's ``F.cross_entropy(z, y, weight=w, ignore_index=-1)``, the weighted mean
over every counted pixel of the batch::

    loss = Σ_p w_{y_p} CE_p / Σ_p w_{y_p},    CE_p = log Σ_k exp z_pk − z_{p,y_p}

With label smoothing ε (``--label-smoothing``) it is PyTorch's ``F.cross_entropy(z, y,
weight=w, ignore_index=-1, label_smoothing=ε)``: each counted pixel's term becomes
(1 − ε)·w_{y_p}·CE_p + (ε/K)·Σ_k w_k·(−log softmax(z_p)_k), over the same denominator
Σ_p w_{y_p}, and its gradient (1 − ε)·w_{y_p}(softmax(z_p) − onehot(y_p)) +
(ε/K)(Σ_k w_k·softmax(z_p) − w).

Both sums run over the pixels of the whole global batch, whichever rank holds them, so each
rank sums its own block (:func:`pixel_cross_entropy`) and the sums meet in one all-reduce
before the gradient w_{y_p}(softmax(z_p) − onehot(y_p)) is divided by the global denominator
(:meth:`hpctrain.run.network.Network.loss`).

Metrics (:class:`PixelTotals`): pixel accuracy, the share of counted pixels whose largest
logit is their label's; and the mean IoU, per class c the intersection, the counted pixels
predicted c and labelled c, over the union, those predicted c or labelled c, averaged over the
classes whose union is not empty. Intersections and unions are counts, summed over ranks and
batches before any division.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def pixel_cross_entropy(xp: Any, logits: Any, labels: Any, weights: Any = None,
                        smoothing: float = 0.0) -> tuple[Any, Any, Any, Any, Any]:
    """Weighted loss sum, weight sum, correct and counted pixels, and d(loss sum)/dlogits.

    ``logits``: ``(n, K, *S)``; ``labels``: ``(n, *S)`` integers, negative where not counted;
    ``weights``: (K,) class weights or None (all 1); ``smoothing``: label smoothing ε in
    [0, 1] (see the module's text). Without smoothing the gradient is
    w_{y_p}·(softmax(z_p) − onehot(y_p)) at counted pixels and 0 elsewhere: dividing it by the
    global weight sum makes it the gradient of the weighted mean.
    """
    classes = logits.shape[1]
    z = xp.moveaxis(logits, 1, -1).reshape(-1, classes)  # (pixels, K)
    y = labels.reshape(-1)
    counted = y >= 0
    safe = xp.where(counted, y, 0)  # a valid index at every pixel; the mask drops the rest
    z = z - z.max(axis=1, keepdims=True)
    exp = xp.exp(z)
    total = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(len(y))
    w = (xp.ones(len(y), dtype=z.dtype) if weights is None
         else xp.asarray(weights, dtype=z.dtype)[safe])
    w = xp.where(counted, w, 0)
    log_total = xp.log(total[:, 0])
    ce = log_total - z[rows, safe]
    correct = ((z.argmax(axis=1) == y) & counted).sum()
    grad = exp / total
    if smoothing:
        loss_sum, grad = _smoothed(xp, z, log_total, ce, grad, rows, safe, w, counted,
                                   weights, smoothing)
    else:
        loss_sum = (w * ce).sum()
        grad[rows, safe] -= 1.0
        grad *= w[:, None]
    grad = xp.moveaxis(grad.reshape(*labels.shape, classes), -1, 1)
    return loss_sum, w.sum(), correct, counted.sum(), xp.ascontiguousarray(grad)


def _smoothed(xp: Any, z: Any, log_total: Any, ce: Any, softmax: Any, rows: Any, safe: Any,
              w: Any, counted: Any, weights: Any, smoothing: float) -> tuple[Any, Any]:
    """The label-smoothed loss sum and gradient of :func:`pixel_cross_entropy` (rows of
    pixels: ``z`` shifted logits (P, K), ``log_total`` log Σ exp z, ``ce`` each pixel's
    cross-entropy, ``softmax`` its probabilities, overwritten by the gradient)."""
    classes = z.shape[1]
    class_w = (xp.ones(classes, dtype=z.dtype) if weights is None
               else xp.asarray(weights, dtype=z.dtype))  # (K,)
    # Σ_k w_k·(−log softmax(z)_k) per pixel, 0 where not counted
    spread = xp.where(counted, log_total * class_w.sum() - z @ class_w, 0)
    loss_sum = (1 - smoothing) * (w * ce).sum() + smoothing / classes * spread.sum()
    grad = softmax
    grad *= ((1 - smoothing) * w + smoothing / classes * class_w.sum()
             * counted.astype(z.dtype))[:, None]
    grad[rows, safe] -= (1 - smoothing) * w
    grad -= (smoothing / classes) * class_w[None, :] * counted.astype(z.dtype)[:, None]
    return loss_sum, grad


def class_counts(xp: Any, logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per class, (intersection, union) pixel counts of the predictions (the largest logit)
    against ``labels``, over the counted pixels (label ≥ 0). ``logits``: ``(n, K, *S)``."""
    classes = logits.shape[1]
    predicted = logits.argmax(axis=1).reshape(-1)
    y = labels.reshape(-1)
    counted = y >= 0
    predicted, y = predicted[counted], y[counted]
    both = xp.bincount(y[predicted == y], minlength=classes)[:classes]
    as_label = xp.bincount(y, minlength=classes)[:classes]
    as_predicted = xp.bincount(predicted, minlength=classes)[:classes]
    return both, as_label + as_predicted - both


@dataclass
class PixelTotals:
    """Sums over pixels (of a rank's block, or of every rank's after an all-reduce): the
    weighted loss and its weights, correct and counted pixels, and per class the
    intersection and union counts of the mean IoU."""

    classes: int
    loss_sum: float = 0.0
    weight_sum: float = 0.0
    correct: int = 0
    counted: int = 0
    intersection: np.ndarray = field(default=None)  # (K,)
    union: np.ndarray = field(default=None)  # (K,)

    def __post_init__(self) -> None:
        if self.intersection is None:
            self.intersection = np.zeros(self.classes, np.int64)
        if self.union is None:
            self.union = np.zeros(self.classes, np.int64)

    def vector(self) -> np.ndarray:
        """Every sum as one float64 vector (for one all-reduce): exact for counts below 2**53."""
        return np.concatenate([[self.loss_sum, self.weight_sum, self.correct, self.counted],
                               self.intersection, self.union]).astype(np.float64)

    @classmethod
    def of_vector(cls, classes: int, vector: Any) -> PixelTotals:
        """The totals :meth:`vector` made (after its all-reduce)."""
        v = np.asarray(vector, dtype=np.float64)
        counts = np.rint(v[4:]).astype(np.int64)
        return cls(classes, float(v[0]), float(v[1]), int(round(v[2])), int(round(v[3])),
                   counts[:classes], counts[classes:])

    def add(self, other: PixelTotals) -> None:
        """Add ``other``'s sums to these."""
        self.loss_sum += other.loss_sum
        self.weight_sum += other.weight_sum
        self.correct += other.correct
        self.counted += other.counted
        self.intersection = self.intersection + other.intersection
        self.union = self.union + other.union

    @property
    def loss(self) -> float:
        """The weighted mean loss, Σ w CE / Σ w (0 where no pixel was counted)."""
        return self.loss_sum / self.weight_sum if self.weight_sum > 0 else 0.0

    @property
    def accuracy(self) -> float:
        """The pixel accuracy, correct over counted pixels."""
        return self.correct / self.counted if self.counted else 0.0

    @property
    def mean_iou(self) -> float:
        """The mean over classes whose union is not empty of intersection / union."""
        present = self.union > 0
        if not present.any():
            return 0.0
        return float((self.intersection[present] / self.union[present]).mean())
