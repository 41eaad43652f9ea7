"""A ``.npy`` array of samples as a held-out source: batches in the array's order, each rank
reading only its block of the memory-mapped file, the last batch padded.

What ``predict --data X.npy`` reads: samples ``(N, *sample_shape)`` stored as the net takes
them (float, not normalised further), or ``(N, F)`` for a net of F·… inputs. There are no
labels: every position is one whose loss is not counted (label −1, or a row of NaN targets),
so ``predict`` writes the outputs and reports no loss.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.data.dataset_format import DatasetError
from hpctrain.data.source import is_map_box
from hpctrain.device.backend import Backend
from hpctrain.errors import shown_path
from hpctrain.io.units import shape_text
from hpctrain.layout.layout import Box


class ArrayData:
    """Batches of ``path``'s samples in order (:class:`~hpctrain.data.source.HeldOutSource`).

    ``sample_shape``: what the net takes per sample; the array's samples must hold exactly
    that, or as many values (a flat net reads (N, F)). ``targets``: the net regresses that
    many targets (0: it classifies), which sets what ``labels`` gives.
    """

    def __init__(self, backend: Backend, path: str | Path, batch: int,
                 sample_shape: tuple[int, ...], targets: int = 0) -> None:
        self.backend, self.path, self.batch, self.targets = backend, Path(path), batch, targets
        name = shown_path(path)
        try:
            array = np.load(self.path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise DatasetError(f"--data {name} is not a readable .npy array ({err})") from None
        if array.ndim < 2 or not np.issubdtype(array.dtype, np.floating):
            raise DatasetError(f"--data {name} holds a {array.dtype} array of shape "
                               f"{array.shape}; give (N, *sample) floats as the net takes them "
                               f"(pixels normalised as in training), or convert it to a "
                               f"dataset with python -m hpctrain convert")
        if tuple(array.shape[1:]) != tuple(sample_shape):
            if math.prod(array.shape[1:]) != math.prod(sample_shape):
                raise DatasetError(f"--data {name} holds samples of shape "
                                   f"{shape_text(array.shape[1:])} but the net takes "
                                   f"{shape_text(sample_shape)}; give --image-size to size "
                                   f"the net to them, or samples of the net's shape")
            array = array.reshape(len(array), *sample_shape)
        self.array, self.size = array, len(array)
        self.sample_shape = tuple(sample_shape)
        self.batches = math.ceil(self.size / batch)
        self.nonfinite: str | None = None

    def images(self, step: int, box: Box) -> Any:
        """Block ``box`` of batch ``step``: rows step·B + lo .. step·B + hi, zeros past N."""
        (lo, hi), *inner = box
        first, last = step * self.batch + lo, step * self.batch + hi
        block = np.zeros((hi - lo, *(b - a for a, b in inner)), self.backend.dtype)
        stop = min(last, self.size)
        if stop > first:
            rows = self.array[(slice(first, stop), *(slice(a, b) for a, b in inner))]
            block[:stop - first] = rows
            if self.nonfinite is None and not np.isfinite(block[:stop - first]).all():
                bad = first + int(np.flatnonzero(~np.isfinite(
                    block[:stop - first].reshape(stop - first, -1)).any(axis=1))[0])
                self.nonfinite = f"--data {self.path}: sample {bad} holds NaN or Inf"
        return self.backend.xp.asarray(block)

    def labels(self, step: int, samples: Any) -> Any:
        """No answers: −1 labels (or label maps of −1), or rows of NaN targets, none of them
        counted."""
        if is_map_box(samples):
            return self.backend.xp.full(tuple(b - a for a, b in samples), -1, np.int64)
        n = samples[1] - samples[0]
        if self.targets:
            return self.backend.xp.full((n, self.targets), np.nan, self.backend.dtype)
        return self.backend.xp.full(n, -1, np.int64)
