"""What the network reads its batches from: a :class:`~hpctrain.data.source.DataSource`, and for
held-out evaluation a :class:`~hpctrain.data.source.HeldOutSource`.

A source gives any rank the block of any batch it asks for, from the batch's number and the
block's global ranges alone, so each rank reads only its own block and the data are the same on
every grid and every number of ranks. Two sources implement it: synthetic data
(:class:`~hpctrain.data.synthetic.SyntheticData`) and an HDF5 dataset
(:class:`~hpctrain.data.dataset.H5Data`).
"""

from __future__ import annotations

from typing import Any, Protocol

from hpctrain.layout.layout import Box


class DataSource(Protocol):
    """Batch ``step``'s images and labels, block by block.

    ``images(step, box)`` is block ``box`` of the ``(B, *sample_shape)`` input of batch ``step``:
    the batch axis relative to the batch, then the sample's axes (C, H, W, or F features);
    ``labels(step, (lo, hi))`` the labels of samples lo..hi-1 of that batch. ``nonfinite`` is
    None until a block read holds NaN or Inf; then it says where, in one line (the network
    then stops every rank with it; see :meth:`hpctrain.run.network.Network.loss`).
    """

    nonfinite: str | None

    def images(self, step: int, box: Box) -> Any:
        ...

    def labels(self, step: int, samples: tuple[int, int]) -> Any:
        ...


class HeldOutSource(DataSource, Protocol):
    """A held-out split, read in ``batches`` batches in order; positions past its end are
    padding, labelled -1, and are not counted."""

    batches: int
