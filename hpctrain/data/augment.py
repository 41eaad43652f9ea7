"""Random flips and crops of training images, drawn per sample and read block by block.

:func:`augment` wraps a training :class:`~hpctrain.data.source.DataSource` of (C, H, W) images.
Each sample gets its own draws from the counter-based generator
(:mod:`hpctrain.kernels.counter_rng`), keyed by the seed, the epoch and the sample's identity:

- ``flip``: a horizontal flip (the width reversed) with probability 1/2;
- ``crop``: the h x w window at offsets (dy, dx), each uniform in [0, H + 2·pad − h] (and
  [0, W + 2·pad − w]), of the image zero-padded by ``pad`` on every side; h x w is the net's
  input, the image's own size by default (offsets in [0, 2·pad]) or smaller (a 224² crop of a
  256² image);
- ``standard``: crop, then flip;
- ``none``: the source itself, or, for a net smaller than the images, their centre window.

A sample's identity is its index in the dataset, with the epoch ``step // steps_per_epoch``,
when the source says where its samples come from (``indices`` and ``steps_per_epoch``, as
:class:`~hpctrain.data.dataset_reader.H5Data`'s training split does); otherwise it is the sample's
number in the stream, ``step * batch + position``, with epoch 0 (as for
:class:`~hpctrain.data.synthetic.SyntheticData`). The draws never depend on the rank, the
position of the sample in a rank's block or the number of processes, so every plan trains on
the same augmented batch.

A block of the augmented batch reads from the source only what it needs: for each sample, the
source rows and columns its window (and flip) maps the block onto, clipped to the image; the
rest of the block is padding, filled with zeros here. Worked example, H = W = 8, pad = 4, a
rank holding augmented rows 4..8 and all columns::

    sample with dy = 1, dx = 6, flipped
      rows:    augmented 4..8  <- padded 5..9  <- source 1..5                 (read 4 rows)
      columns: augmented 0..8  <- cropped 0..8 reversed <- padded 6..14
               <- source 2..10, clipped to 2..8 (read 6 columns, 2 of padding)

Held-out data is never augmented; for a net smaller than the images it reads their centre
window (``none``).

Label maps (a segmentation's answers, one class per pixel) go through the same window and flip
as their image, block by block: a pixel of the augmented map is the label of the pixel of the
augmented image at the same place, and padding is labelled −1 (not counted).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.data.source import DataSource, is_map_box
from hpctrain.errors import UserError, shown
from hpctrain.kernels.counter_rng import stream_key, uniform
from hpctrain.layout.layout import Box

AUGMENT_MODES = ("none", "flip", "crop", "standard")
AUGMENT_STREAM = 21  # counter-RNG purpose word of the augmentation draws
FLIP, ROW_OFFSET, COLUMN_OFFSET = range(3)  # draw k of a sample is counter 3·identity + k
DRAWS = 3


def augment(source: DataSource, mode: str, seed: int, pad: int = 4,
            batch: int | None = None, size: tuple[int, int] | None = None) -> DataSource:
    """The training source ``source`` under augmentation ``mode``; ``source`` itself for none
    at the images' own size.

    Parameters
    ----------
    source : a training source of (C, H, W) images.
    mode : none, flip, crop or standard (crop, then flip).
    seed : the run's seed; with the epoch and the sample's identity it keys every draw.
    pad : zero padding on every side for the crop; offsets are uniform in [0, 2·pad].
    batch : the global batch, to number samples of a source without ``indices``; default
        ``source.batch``.
    size : the (h, w) the net reads, at most the images' (H + 2·pad, W + 2·pad); default the
        images' own.

    Raises
    ------
    UserError
        An unknown mode, a negative pad, a held-out split, or samples that are not images.
    """
    if mode not in AUGMENT_MODES:
        raise UserError(f"--augment {shown(mode)}; choose one of {', '.join(AUGMENT_MODES)}")
    if mode == "none" and size in (None, tuple(getattr(source, "sample_shape", ()))[1:]):
        return source
    return Augmented(source, mode, seed, pad, batch, size)


def window_size(input_shape: tuple[int, ...]) -> tuple[int, int] | None:
    """The (h, w) window of each image that a net of ``input_shape`` reads, as :func:`augment`'s
    ``size``; None for a net that does not take (C, h, w) images.

    >>> window_size((3, 224, 224)), window_size((64,)), window_size((4, 32, 32, 32))
    ((224, 224), None, None)
    """
    return (input_shape[1], input_shape[2]) if len(input_shape) == 3 else None


@dataclass(frozen=True)
class _SourceShape:
    """The training source as the checks of :class:`Augmented` see it: the shape of its samples
    and its batch, nothing to read."""

    sample_shape: tuple[int, ...]
    batch: int


def check_augment(mode: str, net_name: str, input_shape: tuple[int, ...],
                  sample_shape: tuple[int, ...] | None, batch: int) -> None:
    """Refuse an ``--augment`` mode that cannot apply to what a net reads, before any planning
    or kernel timing, as every other flag is.

    ``--net mlp --augment flip`` is refused: flat samples, no image to flip. A run wraps its
    source in :func:`augment` only after planning; the same call on a stand-in of the source's
    shape makes the same checks now, so the rules stay in one place.

    Parameters
    ----------
    mode : the ``--augment`` mode.
    net_name : the net's name, for the message.
    input_shape : what the net reads per sample.
    sample_shape : the dataset's samples, or None for synthetic data of the net's own shape.
    batch : the global batch.

    Raises
    ------
    UserError
        What :func:`augment` refuses, prefixed with the net: samples that are not (C, H, W)
        images, or a net input that cannot be cut from them.
    """
    if mode == "none" and sample_shape is None:  # synthetic data of the net's own shape, as it is
        return
    shape = input_shape
    if sample_shape is not None:
        from hpctrain.data.dataset_fit import feeds_flat  # h5py: only when a command runs

        if not feeds_flat(sample_shape, input_shape):  # flattened: the net's shape
            shape = sample_shape
    try:
        augment(_SourceShape(tuple(shape), batch), mode, seed=0, size=window_size(input_shape))
    except UserError as err:
        raise UserError(f"--net {shown(net_name, quoted=False)}: {err}") from None


class Augmented:
    """A training source whose images are flipped and cropped per sample; see the module doc.

    ``images(step, box)`` is block ``box`` of the augmented batch ``step``, equal to the same box
    cut from the augmented whole batch; ``labels`` are the source's, but label maps, which are
    cropped and flipped as their images; ``nonfinite`` is the source's.
    """

    def __init__(self, source: DataSource, mode: str, seed: int, pad: int = 4,
                 batch: int | None = None, size: tuple[int, int] | None = None) -> None:
        if mode not in AUGMENT_MODES:
            raise UserError(f"augmentation {shown(mode)}; choose none, flip, crop or standard")
        if pad < 0:
            raise UserError(f"crop padding {pad}; give 0 or more pixels")
        if mode != "none" and getattr(source, "split", "train") != "train":
            raise UserError("held-out data is never augmented; wrap the training split only")
        shape = tuple(getattr(source, "sample_shape", ()))
        if len(shape) != 3:
            raise UserError(f"--augment {mode} flips and crops (C, H, W) images, but the "
                            f"samples have shape {shape or 'unknown'}; use --augment none")
        self.size = tuple(size) if size is not None else shape[1:]
        padded = (shape[1] + 2 * pad, shape[2] + 2 * pad)
        if not all(1 <= s <= p for s, p in zip(self.size, padded, strict=True)):
            raise UserError(f"a {self.size[0]}x{self.size[1]} net input cannot be cut from "
                            f"{shape[1]}x{shape[2]} images padded by {pad}; give an "
                            f"--image-size of at most {min(padded)}")
        self.source, self.mode, self.seed, self.pad = source, mode, seed, pad
        self.sample_shape = (shape[0], *self.size)  # what the net reads
        self.source_shape = shape
        self.flips = mode in ("flip", "standard")
        self.crops = mode in ("crop", "standard")
        self.by_index = hasattr(source, "indices") and hasattr(source, "steps_per_epoch")
        self.batch = batch if batch is not None else getattr(source, "batch", None)
        if not self.by_index and self.batch is None:
            raise UserError("the source does not number its samples; give the batch size")

    @property
    def nonfinite(self) -> str | None:
        return self.source.nonfinite

    @nonfinite.setter
    def nonfinite(self, note: str | None) -> None:  # a prefetcher drops a read-ahead's note
        self.source.nonfinite = note

    @property
    def batches(self) -> int:
        """A held-out source's number of batches."""
        return self.source.batches

    def labels(self, step: int, samples: Any) -> Any:
        """The source's labels (or targets) of samples lo..hi-1 of batch ``step``; for label
        maps (``samples`` a box, :func:`~hpctrain.data.source.is_map_box`) block ``samples``
        of the augmented maps, cropped and flipped as the images are, −1 in the padding."""
        if not is_map_box(samples):
            return self.source.labels(step, samples)
        (lo, hi), rows, columns = samples
        xp = self.source.backend.xp
        out = xp.full((hi - lo, rows[1] - rows[0], columns[1] - columns[0]), -1, dtype=xp.int64)
        for k, read_rows, read_columns, at_rows, at_columns, flip in self._pieces(
                step, (lo, hi), rows, columns):
            part = self.source.labels(step, ((lo + k, lo + k + 1), read_rows, read_columns))
            out[k, at_rows, at_columns] = part[0, :, ::-1] if flip else part[0]
        return out

    def close(self) -> None:
        """Close the source, when it has files open."""
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def identities(self, step: int, samples: tuple[int, int]) -> tuple[int, np.ndarray]:
        """The epoch and the uint64 identity of positions lo..hi-1 of batch ``step``."""
        lo, hi = samples
        if self.by_index:
            index = np.asarray(self.source.indices(step, samples), dtype=np.int64)
            return step // self.source.steps_per_epoch, index.astype(np.uint64)
        first = step * self.batch
        return 0, np.arange(first + lo, first + hi, dtype=np.uint64)

    def draws(self, step: int, samples: tuple[int, int]) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
        """Flip (bool), row offset dy and column offset dx of positions lo..hi-1 of ``step``.

        Offsets lie in [0, H + 2·pad − h] and [0, W + 2·pad − w]; without a crop they are the
        centre's (``pad`` when the window is the image).
        """
        spans = [image + 2 * self.pad - window + 1  # the offsets a window may take
                 for image, window in zip(self.source_shape[1:], self.size, strict=True)]
        n = samples[1] - samples[0]
        if not (self.flips or self.crops):  # the centre window: nothing drawn
            return np.zeros(n, bool), *(np.full(n, (span - 1) // 2, np.int64) for span in spans)
        epoch, identity = self.identities(step, samples)
        key = stream_key(self.seed, AUGMENT_STREAM, epoch)
        counter = identity[:, None] * np.uint64(DRAWS) + np.arange(DRAWS, dtype=np.uint64)
        u = uniform(np, key, counter, np.float64)  # (n, DRAWS)
        flip = (u[:, FLIP] < 0.5) if self.flips else np.zeros(n, bool)
        if not self.crops:
            return flip, *(np.full(n, (span - 1) // 2, np.int64) for span in spans)
        dy, dx = (np.minimum((u[:, draw] * span).astype(np.int64), span - 1)
                  for draw, span in zip((ROW_OFFSET, COLUMN_OFFSET), spans, strict=True))
        return flip, dy, dx

    def images(self, step: int, box: Box) -> Any:
        """Block ``box`` of the augmented ``(B, C, H, W)`` batch ``step``.

        Each sample reads one source box: its channels, and the rows and columns its window
        maps the block onto, clipped to the image; the padding is zeros.
        """
        (lo, hi), channels, rows, columns = box
        xp = self.source.backend.xp
        out = xp.zeros(tuple(b - a for a, b in box), dtype=self.source.backend.dtype)
        for k, read_rows, read_columns, at_rows, at_columns, flip in self._pieces(
                step, (lo, hi), rows, columns):
            part = self.source.images(step, ((lo + k, lo + k + 1), channels, read_rows,
                                             read_columns))
            out[k, :, at_rows, at_columns] = part[0, :, :, ::-1] if flip else part[0]
        return out

    def _pieces(self, step: int, samples: tuple[int, int], rows: tuple[int, int],
                columns: tuple[int, int]) -> Iterator[tuple[int, tuple[int, int],
                                                          tuple[int, int], slice, slice, bool]]:
        """For each sample k of ``samples`` whose block (augmented ``rows`` and ``columns``)
        is not all padding: (k, the source rows and columns it reads, the block's rows and
        columns they fill, whether they are flipped). Images and label maps alike."""
        (lo, hi), (h0, h1), (w0, w1) = samples, rows, columns
        _, height, width = self.source_shape
        window = self.size[1]
        flip, dy, dx = self.draws(step, (lo, hi))
        span = w1 - w0
        for k in range(hi - lo):
            # cropped columns q0..q1 hold the block's columns, reversed when flipped
            q0, q1 = (window - w1, window - w0) if flip[k] else (w0, w1)
            r0, s0 = h0 + int(dy[k]) - self.pad, q0 + int(dx[k]) - self.pad  # source origin
            a0, a1 = max(r0, 0), min(r0 + h1 - h0, height)  # source rows read
            b0, b1 = max(s0, 0), min(s0 + q1 - q0, width)  # source columns read
            if a1 <= a0 or b1 <= b0:
                continue  # the block of this sample is all padding
            # flipped, cropped column q0 + i sits at block column span - 1 - i
            at_columns = (slice(span - (b1 - s0), span - (b0 - s0)) if flip[k]
                          else slice(b0 - s0, b1 - s0))
            yield k, (a0, a1), (b0, b1), slice(a0 - r0, a1 - r0), at_columns, bool(flip[k])
