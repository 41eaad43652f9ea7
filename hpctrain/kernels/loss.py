"""The losses: softmax cross-entropy against class labels, mean squared error against targets.

Each gives the loss summed over the samples given, a count of those right (the correct classes;
none under regression) and the gradient of scale·loss with respect to the outputs.
"""

from __future__ import annotations

from typing import Any


def softmax_cross_entropy(xp: Any, logits: Any, labels: Any, scale: float
                          ) -> tuple[Any, Any, Any]:
    """Summed loss, number correct, and d(scale·loss)/dlogits for logits: (N, K), labels: (N,).

    loss = Σ_n [log Σ_k exp z_nk − z_n,y_n]; the gradient is scale·(softmax(z) − onehot(y)).
    """
    z = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(z)
    total = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(len(labels))
    loss_sum = (xp.log(total[:, 0]) - z[rows, labels]).sum()
    correct = (logits.argmax(axis=1) == labels).sum()
    grad = exp / total
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


def loss_function(regression: bool) -> Any:
    """The loss of a net: :func:`mean_squared_error` under regression (``targets=``), else
    :func:`softmax_cross_entropy`."""
    return mean_squared_error if regression else softmax_cross_entropy
