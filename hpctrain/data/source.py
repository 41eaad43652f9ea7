"""The sources the network reads its batches from, for training and for held-out evaluation.

Training reads a :class:`~hpctrain.data.source.DataSource`, held-out evaluation a
:class:`~hpctrain.data.source.HeldOutSource`.

A source gives any rank the block of any batch it asks for, from the batch's number and the
block's global ranges alone, so each rank reads only its own block and the data are the same on
every grid and every number of ranks. Two sources implement it: synthetic data
(:class:`~hpctrain.data.synthetic.SyntheticData`) and an HDF5 dataset
(:class:`~hpctrain.data.dataset_reader.H5Data`).
"""

from __future__ import annotations

from typing import Any, Protocol

from hpctrain.layout.layout import Box


class DataSource(Protocol):
    """Batch ``step``'s images and labels (or targets), block by block.

    ``images(step, box)`` is block ``box`` of the ``(B, *sample_shape)`` input of batch ``step``:
    the batch axis relative to the batch, then the sample's axes (C, H, W; C, D, H, W for
    volumes; or F features), e.g. ``((lo, hi), (c0, c1), (d0, d1), (h0, h1), (w0, w1))``.
    ``labels(step, (lo, hi))`` gives what samples lo..hi-1 of that batch are trained towards:
    for a classifier int64 labels, shape (n,); for a regression (mean squared error) float
    targets in the backend's dtype, shape (n, T). For a segmentation net the network asks for
    a block of the label maps instead, ``labels(step, ((lo, hi), (h0, h1), (w0, w1)))`` (the
    samples, then a range per spatial axis, (d0, d1) first for volumes): int64 (n, h, w), −1
    at a pixel that is not counted (see :func:`is_map_box`). ``nonfinite`` is None until a
    block read holds NaN or Inf, or meets a damaged file; then it says where, in one line (the
    network then stops every rank with it; see :meth:`hpctrain.run.network.Network.loss`).
    """

    nonfinite: str | None

    def images(self, step: int, box: Box) -> Any:
        ...

    def labels(self, step: int, samples: tuple[int, int]) -> Any:
        ...


def is_map_box(where: Any) -> bool:
    """Whether a ``labels`` request is a block of label maps (a box: ``((lo, hi), (h0, h1),
    …)``) rather than the samples ``(lo, hi)`` of per-sample answers.

    >>> is_map_box((0, 4)), is_map_box(((0, 4), (0, 8), (0, 8)))
    (False, True)
    """
    return isinstance(where[0], tuple | list)


class HeldOutSource(DataSource, Protocol):
    """A held-out split, read in ``batches`` batches in order.

    Positions past its end are padding and are not counted: their label is -1, or their row of
    targets is all NaN (the network skips a row holding NaN).
    """

    batches: int


class MicroBatches:
    """The micro-batches of ``source``'s batches (``--accumulate K``): batch m here is samples
    (m mod K)·b … (m mod K)·b + b − 1 of ``source``'s batch ⌊m / K⌋, b = ``micro`` samples
    (the source's batch is K·b).

    A step that accumulates reads micro-batches step·K … step·K + K − 1 (see
    :meth:`~hpctrain.run.network.Network.train_step`): the same samples, in the same order,
    augmented the same way, as a step of the whole batch would read. Worked example, K = 2,
    b = 4: micro-batch 5 is samples 4..7 of batch 2, so ``images(5, ((0, 2), ...))`` reads
    ``source.images(2, ((4, 6), ...))``. Wrap it, not the source, in
    :class:`~hpctrain.data.prefetch.Prefetched`, which reads batch m + 1 ahead of batch m.
    """

    def __init__(self, source: DataSource, accumulate: int, micro: int) -> None:
        self.source, self.accumulate, self.micro = source, accumulate, micro

    @property
    def nonfinite(self) -> str | None:
        return self.source.nonfinite

    @property
    def batches(self) -> int:
        """A held-out split's batches, in micro-batches."""
        return self.source.batches * self.accumulate

    def _shifted(self, batch: int, where: Any) -> tuple[int, Any]:
        """The source's batch and ``where`` (a box, or samples (lo, hi)) moved onto it."""
        step, index = divmod(batch, self.accumulate)
        offset = index * self.micro
        if is_map_box(where):  # a block: its samples first
            (lo, hi), *rest = where
            return step, ((lo + offset, hi + offset), *rest)
        return step, (where[0] + offset, where[1] + offset)

    def images(self, batch: int, box: Box) -> Any:
        step, moved = self._shifted(batch, box)
        return self.source.images(step, moved)

    def labels(self, batch: int, samples: Any) -> Any:
        step, moved = self._shifted(batch, samples)
        return self.source.labels(step, moved)

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # not set yet: no recursion while constructing
            raise AttributeError(name)
        return getattr(self.source, name)
