"""Synthetic, learnable, ImageNet-shaped data, drawn block by block by global index."""

from __future__ import annotations

import math
from typing import Any

from hpctrain.device.backend import Backend
from hpctrain.io.seeds import check_seed
from hpctrain.kernels.counter_rng import global_index, stream_key, uniform, uniform_block
from hpctrain.layout.layout import Box

LABEL_STREAM, NOISE_STREAM, PATTERN_STREAM = 11, 12, 13


class SyntheticData:
    """Batch ``step`` of a deterministic stream: sample g has label hash(g) mod K and image
    ``pattern[label] + noise(g)``, so the classes are separable and a net can learn them.

    A rank draws only its own block (its samples, and its rows when the input is height-split):
    the data are the same on every grid. Its values are always finite, so ``nonfinite`` (the
    readers' note of a NaN or Inf read, see :class:`~hpctrain.data.dataset.H5Data`) stays None.
    """

    nonfinite: str | None = None

    def __init__(self, backend: Backend, sample_shape: tuple[int, ...], classes: int,
                 batch: int, seed: int = 0, noise: float = 0.5) -> None:
        self.backend, self.sample_shape, self.classes = backend, sample_shape, classes
        self.batch, self.seed, self.noise = batch, check_seed(seed), noise

    def labels(self, step: int, samples: tuple[int, int]) -> Any:
        xp = self.backend.xp
        g = xp.arange(step * self.batch + samples[0], step * self.batch + samples[1],
                      dtype=xp.uint64)
        u = uniform(xp, stream_key(self.seed, LABEL_STREAM), g, xp.float64)
        return xp.minimum((u * self.classes).astype(xp.int64), self.classes - 1)

    def images(self, step: int, box: Box) -> Any:
        """Block ``box`` of the ``(B, *sample_shape)`` input of batch ``step``."""
        xp, dtype = self.backend.xp, self.backend.dtype
        first = step * self.batch  # sample g of the stream is sample g - first of this batch
        samples = (box[0][0] + first, box[0][1] + first)
        stream = (1 << 40, *self.sample_shape)
        noise = uniform_block(xp, stream_key(self.seed, NOISE_STREAM), stream,
                              (samples, *box[1:]), dtype)
        labels = self.labels(step, box[0]).astype(xp.uint64)
        per_sample = global_index(xp, (1, *self.sample_shape), ((0, 1), *box[1:]))
        size = math.prod(self.sample_shape)
        index = labels.reshape((-1,) + (1,) * len(self.sample_shape)) * xp.uint64(size)
        pattern = uniform(xp, stream_key(self.seed, PATTERN_STREAM), index + per_sample, dtype)
        return (pattern * 2 - 1) + dtype(self.noise) * (noise * 2 - 1)
