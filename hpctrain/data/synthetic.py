"""Synthetic, learnable data of any sample shape, drawn block by block by global index."""

from __future__ import annotations

import math
from typing import Any

from hpctrain.device.backend import Backend
from hpctrain.io.seeds import check_seed
from hpctrain.kernels.counter_rng import global_index, stream_key, uniform, uniform_block
from hpctrain.layout.layout import Box

LABEL_STREAM, NOISE_STREAM, PATTERN_STREAM, TARGET_STREAM = 11, 12, 13, 14
REGRESSION_PATTERNS = 16  # hidden patterns behind the targets of a regression


class SyntheticData:
    """Batch ``step`` of a deterministic stream of samples whose answers a net can learn.

    Sample g has a hidden index h(g) = hash(g) mod P and image ``pattern[h] + noise(g)``, so
    the patterns are separable. A classifier (``regression=False``) has P = ``classes`` and
    label h(g). A regression has P = REGRESSION_PATTERNS (16) and ``classes`` = T targets per
    sample: target t of sample g is ``2 u(h(g), t) - 1``, a fixed random function of the
    hidden index with values in [-1, 1), so the targets follow from the image.

    With ``maps`` (a segmentation net's stream) the answers are label maps instead: pixel p of
    sample g is labelled ``floor(K·u)``, u the uniform number behind channel 0 of the pattern
    at p (its image is ``2u − 1`` plus noise there), so each pixel's class follows from its
    own values.

    Samples may have any shape: (C, H, W) images, (C, D, H, W) volumes or (F,) features. A rank
    draws only its own block (its samples, and its rows or depth planes when the input is
    split): the data are the same on every grid and every number of ranks. Its values are
    always finite, so ``nonfinite`` (the readers' note of a NaN or Inf read, see
    :class:`~hpctrain.data.dataset_reader.H5Data`) stays None.
    """

    nonfinite: str | None = None

    def __init__(self, backend: Backend, sample_shape: tuple[int, ...], classes: int,
                 batch: int, seed: int = 0, noise: float = 0.5, regression: bool = False,
                 maps: bool = False) -> None:
        self.backend, self.sample_shape, self.classes = backend, sample_shape, classes
        self.batch, self.seed, self.noise = batch, check_seed(seed), noise
        self.regression, self.maps = regression, maps
        self.patterns = REGRESSION_PATTERNS if regression else classes

    @classmethod
    def for_net(cls, backend: Backend, net: Any, batch: int, seed: int = 0) -> SyntheticData:
        """The stream a net trains on without a dataset: its input shape, its outputs
        (classes, or targets under regression); ``net`` a
        :class:`~hpctrain.model.net.NetSpec`."""
        return cls(backend, net.input_shape, net.classes, batch, seed,
                   regression=net.regression, maps=net.per_pixel)

    def hidden(self, step: int, samples: tuple[int, int]) -> Any:
        """The int64 hidden pattern index in [0, patterns) of samples lo..hi-1 of batch ``step``."""
        xp = self.backend.xp
        g = xp.arange(step * self.batch + samples[0], step * self.batch + samples[1],
                      dtype=xp.uint64)
        u = uniform(xp, stream_key(self.seed, LABEL_STREAM), g, xp.float64)
        return xp.minimum((u * self.patterns).astype(xp.int64), self.patterns - 1)

    def labels(self, step: int, samples: Any) -> Any:
        """Labels (n,) int64 of samples lo..hi-1 of batch ``step``, or their (n, T) targets;
        with ``maps``, block ``samples`` (samples, then a range per spatial axis) of the
        label maps."""
        if self.maps:
            return self.label_maps(step, samples)
        hidden = self.hidden(step, samples)
        if not self.regression:
            return hidden
        xp = self.backend.xp
        index = (hidden.astype(xp.uint64)[:, None] * xp.uint64(self.classes)
                 + xp.arange(self.classes, dtype=xp.uint64)[None, :])  # (n, T)
        targets = uniform(xp, stream_key(self.seed, TARGET_STREAM), index, self.backend.dtype)
        return targets * 2 - 1

    def label_maps(self, step: int, box: Box) -> Any:
        """Block ``box`` ((lo, hi), then a range per spatial axis) of batch ``step``'s int64
        label maps (see the class doc)."""
        xp = self.backend.xp
        hidden = self.hidden(step, box[0]).astype(xp.uint64)
        per_sample = global_index(xp, (1, *self.sample_shape), ((0, 1), (0, 1), *box[1:]))
        size = math.prod(self.sample_shape)
        index = hidden.reshape((-1,) + (1,) * len(self.sample_shape)) * xp.uint64(size)
        u = uniform(xp, stream_key(self.seed, PATTERN_STREAM), index + per_sample, xp.float64)
        labels = xp.minimum((u * self.classes).astype(xp.int64), self.classes - 1)
        return labels[:, 0]

    def images(self, step: int, box: Box) -> Any:
        """Block ``box`` of the ``(B, *sample_shape)`` input of batch ``step``."""
        xp, dtype = self.backend.xp, self.backend.dtype
        first = step * self.batch  # sample g of the stream is sample g - first of this batch
        samples = (box[0][0] + first, box[0][1] + first)
        stream = (1 << 40, *self.sample_shape)
        noise = uniform_block(xp, stream_key(self.seed, NOISE_STREAM), stream,
                              (samples, *box[1:]), dtype)
        hidden = self.hidden(step, box[0]).astype(xp.uint64)
        per_sample = global_index(xp, (1, *self.sample_shape), ((0, 1), *box[1:]))
        size = math.prod(self.sample_shape)
        index = hidden.reshape((-1,) + (1,) * len(self.sample_shape)) * xp.uint64(size)
        pattern = uniform(xp, stream_key(self.seed, PATTERN_STREAM), index + per_sample, dtype)
        return (pattern * 2 - 1) + dtype(self.noise) * (noise * 2 - 1)
