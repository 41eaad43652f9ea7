"""Synthetic cosmology-like volumes, 3-D Gaussian random fields labelled with their parameters.

A stand-in for CosmoFlow's simulated universes, with the same shape of problem: a sample is a
C x S x S x S volume, and the net regresses the T parameters it was made from. Sample i of a
set with seed s draws everything from ``numpy.random.default_rng([s, i])``, so any sample can be
made alone, on any rank, and is the same whoever makes it:

1. the parameters, uniformly in their ranges (``PARAMETERS``): the slope n, the amplitude
   σ, the cut-off k_c and the log-normal strength λ. The first T vary and are the targets,
   each mapped linearly from its range to [-1, 1]; the others stay at the middle of their
   range.
2. white noise w, S^3 standard normal values, coloured in Fourier space into a Gaussian
   random field δ of a periodic box with the isotropic power spectrum

       P(k) = A k^-n exp(-(k / k_c)^2),

   k in units of the box's fundamental wavenumber, k_c a fraction of the Nyquist wavenumber
   S/2, and A such that δ's expected variance is σ^2 (:func:`gaussian_field`). The mean,
   k = 0, is zero.
3. C channels, like CosmoFlow's redshifts: channel c grows the field by g_c = (c + 1) / C and
   passes it through a log-normal transform, ``(exp(λ g_c δ - (λ g_c σ)^2 / 2) - 1) / λ``,
   which has mean zero, is g_c δ where λ δ is small, and is skewed by λ elsewhere
   (:func:`lognormal_channels`).

Every target shows in the field: the slope in how the power falls with k, the amplitude in the
variance, the cut-off in the lack of small-scale power, and the strength in the skewness, which
grows from channel to channel. :func:`write_universe` writes a set as a dataset file
(:mod:`hpctrain.data.dataset_format`), one sample at a time; ``python -m hpctrain convert --universe
N`` is its command line.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpctrain.cost.memory import available_bytes
from hpctrain.data.dataset_format import DatasetError
from hpctrain.data.dataset_writer import write_batches
from hpctrain.io.seeds import check_seed
from hpctrain.io.units import format_bytes

MIN_SIZE, MAX_SIZE = 4, 2048  # voxels per side
# float32 S^3 fields held at once while a sample is made: the noise, its Fourier transform
# and the filtered one (complex, half the modes), the wavenumbers, the field and the
# temporaries of the transforms; measured at 8.6 (tracemalloc, S = 64 and 128)
FIELD_COPIES = 9
CHANNEL_COPIES = 1.25  # per channel: the channel, and the writer's finite check (1 byte)


@dataclass(frozen=True)
class ParameterRange:
    """One parameter of a synthetic universe, drawn uniformly in [low, high]."""

    name: str
    low: float
    high: float
    meaning: str

    @property
    def middle(self) -> float:
        """The value used when the parameter is not a target."""
        return (self.low + self.high) / 2

    def target(self, value: float) -> float:
        """``value`` mapped linearly from [low, high] to the target [-1, 1]."""
        return 2 * (value - self.low) / (self.high - self.low) - 1


PARAMETERS = (
    ParameterRange("slope", 1.0, 3.0, "n of the power spectrum P(k) = A k^-n exp(-(k/k_c)^2)"),
    ParameterRange("amplitude", 0.4, 1.0, "sigma, the Gaussian field's expected rms, which sets A"),
    ParameterRange("cutoff", 0.3, 1.0, "k_c, a fraction of the Nyquist wavenumber S/2"),
    ParameterRange("strength", 0.1, 0.8, "lambda, the log-normal strength of the channels"),
)


@dataclass(frozen=True)
class Universe:
    """A set of synthetic universes of C channels of S^3 voxels, the first T parameters varied.

    >>> volume, targets = Universe(size=8, channels=2, targets=3, seed=1).sample(0)
    >>> volume.shape, volume.dtype, targets.shape
    ((2, 8, 8, 8), dtype('float32'), (3,))
    """

    size: int = 32
    channels: int = 4
    targets: int = len(PARAMETERS)
    seed: int = 0

    def __post_init__(self) -> None:
        if not MIN_SIZE <= self.size <= MAX_SIZE:
            raise DatasetError(f"--size {self.size} must be from {MIN_SIZE} to {MAX_SIZE} "
                               f"voxels per side")
        if self.channels < 1:
            raise DatasetError(f"--channels {self.channels} must be at least 1")
        if not 1 <= self.targets <= len(PARAMETERS):
            names = ", ".join(p.name for p in PARAMETERS)
            raise DatasetError(f"--targets-count {self.targets} must be from 1 to "
                               f"{len(PARAMETERS)} (the parameters {names}, in that order)")
        check_seed(self.seed)

    @property
    def sample_shape(self) -> tuple[int, int, int, int]:
        return (self.channels, self.size, self.size, self.size)

    def parameters(self, rng: np.random.Generator) -> dict[str, float]:
        """Draw one sample's parameters, the first ``targets`` uniformly, the rest their middle.

        Always draws one number per parameter, so the noise that follows is the same for any
        number of targets.
        """
        drawn = rng.random(len(PARAMETERS))
        return {p.name: p.low + u * (p.high - p.low) if k < self.targets else p.middle
                for k, (p, u) in enumerate(zip(PARAMETERS, drawn, strict=True))}

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample ``index``, its float32 volume (C, S, S, S) and its float32 targets (T,)."""
        rng = np.random.default_rng([self.seed, index])
        values = self.parameters(rng)
        noise = rng.standard_normal((self.size,) * 3, dtype=np.float32)
        field = gaussian_field(noise, values["slope"], values["amplitude"], values["cutoff"])
        volume = lognormal_channels(field, values["amplitude"], values["strength"],
                                    self.channels)
        targets = [p.target(values[p.name]) for p in PARAMETERS[:self.targets]]
        return volume, np.asarray(targets, np.float32)

    @property
    def sample_bytes(self) -> int:
        """The memory making one sample takes at its peak (see FIELD_COPIES), in bytes.

        >>> format_bytes(Universe(size=2048, channels=4).sample_bytes)
        '448 GiB'
        """
        return round(4 * self.size ** 3 * (FIELD_COPIES + CHANNEL_COPIES * self.channels))

    def check_memory(self, available: float | None = None) -> None:
        """Refuse a size whose one sample does not fit in ``available`` bytes (default:
        MemAvailable, :func:`~hpctrain.cost.memory.available_bytes`), naming what it needs and
        the largest size that fits: a sample is one field, made whole by FFTs.

        Raises
        ------
        DatasetError
            One sample needs more than ``available``.
        """
        available = available_bytes() if available is None else available
        if self.sample_bytes <= available:
            return
        per_voxel = 4 * (FIELD_COPIES + CHANNEL_COPIES * self.channels)
        fits = int((available / per_voxel) ** (1 / 3))
        while fits > 0 and fits ** 3 * per_voxel > available:  # floating point's cube root
            fits -= 1
        field = format_bytes(4 * self.size ** 3)
        hint = (f"choose --size {fits} or less" if fits >= MIN_SIZE else
                "fewer --channels, or a machine with more memory")
        raise DatasetError(f"--size {self.size} with --channels {self.channels}: making one "
                           f"volume needs about {format_bytes(self.sample_bytes)} (its "
                           f"{self.size}^3 field, {field} in float32, held about "
                           f"{FIELD_COPIES} times over by its Fourier transforms, and "
                           f"{self.channels} channel{'s' * (self.channels > 1)}), more than the "
                           f"{format_bytes(available)} of memory available; {hint}")

    def describe(self, samples: int) -> str:
        """What a set of ``samples`` of these universes is, for the dataset's description."""
        ranges = "; ".join(f"{p.name} in [{p.low:g}, {p.high:g}] ({p.meaning})"
                           for p in PARAMETERS[:self.targets])
        fixed = ", ".join(f"{p.name} = {p.middle:g}" for p in PARAMETERS[self.targets:])
        return (f"synthetic universes (hpctrain.data.universe, seed {self.seed}): {samples} "
                f"Gaussian random fields of {self.size}^3 voxels in {self.channels} log-normal "
                f"channels; targets {', '.join(p.name for p in PARAMETERS[:self.targets])}, "
                f"each mapped from its range to [-1, 1]: {ranges}"
                + (f"; fixed {fixed}" if fixed else ""))


@functools.lru_cache(maxsize=2)
def wavenumbers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The wavenumbers of the rfft grid of a size^3 box, and each mode's count in the full grid.

    The magnitude k of each mode of ``numpy.fft.rfftn``'s grid is in units of the fundamental
    wavenumber 2π / L: whole numbers along each axis, up to the Nyquist wavenumber size / 2.
    The rfft grid holds half the modes: a mode of the last axis strictly between 0 and Nyquist
    stands for itself and its conjugate, so it counts 2.
    Both arrays are float32, shaped (size, size, size // 2 + 1), and read-only (cached).
    """
    along = np.fft.fftfreq(size, 1 / size).astype(np.float32)
    last = np.fft.rfftfreq(size, 1 / size).astype(np.float32)
    k = np.sqrt(along[:, None, None] ** 2 + along[None, :, None] ** 2 + last[None, None, :] ** 2)
    count = np.full(len(last), 2, np.float32)
    count[0] = 1
    if size % 2 == 0:
        count[-1] = 1  # the Nyquist plane is its own conjugate
    count = np.broadcast_to(count, k.shape)
    k.setflags(write=False)
    return k, count


def gaussian_field(noise: np.ndarray, slope: float, amplitude: float,
                   cutoff: float = math.inf) -> np.ndarray:
    """White ``noise`` (S, S, S) coloured to the power spectrum P(k) = A k^-slope exp(-(k/k_c)^2).

    k_c = ``cutoff`` · S / 2 (``math.inf``: no cut-off), and A makes the field's expected
    variance the square of ``amplitude``: with unit-variance noise w, the field
    irfft(rfft(w) · sqrt(P)) has variance mean(P) over the full Fourier grid. Periodic,
    isotropic, mean zero; float32.
    """
    size = noise.shape[0]
    k, count = wavenumbers(size)
    with np.errstate(divide="ignore"):
        shape = np.where(k > 0, k ** np.float32(-slope), np.float32(0))
    if math.isfinite(cutoff):
        shape *= np.exp(-(k / np.float32(cutoff * size / 2)) ** 2)
    variance = float(np.sum(shape * count, dtype=np.float64)) / size ** 3
    scale = np.sqrt(shape * np.float32(amplitude ** 2 / variance))
    return np.fft.irfftn(np.fft.rfftn(noise) * scale, s=noise.shape,
                         axes=(0, 1, 2)).astype(np.float32)


def lognormal_channels(field: np.ndarray, amplitude: float, strength: float,
                       channels: int) -> np.ndarray:
    """C float32 channels of ``field`` at growth g_c = (c + 1) / C, each log-normal.

    Channel c is ``(exp(λ g_c δ - (λ g_c σ)^2 / 2) - 1) / λ`` for δ = ``field``, σ =
    ``amplitude`` (δ's expected rms) and λ = ``strength``: mean zero, and g_c δ where λ δ is
    small.
    """
    out = np.empty((channels, *field.shape), np.float32)
    for c in range(channels):
        stretch = strength * (c + 1) / channels
        np.expm1(np.float32(stretch) * field - np.float32((stretch * amplitude) ** 2 / 2),
                 out=out[c])
        out[c] /= np.float32(strength)
    return out


def power_spectrum(field: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The spherically averaged power spectrum of a periodic (S, S, S) ``field``.

    Returns (k, P): for each whole wavenumber k = 1 .. S/2, the mean of
    ``abs(rfftn(field))**2 / S**3`` over the modes whose wavenumber rounds to k (a shell). For
    a field of :func:`gaussian_field`, P(k) is A k^-n exp(-(k/k_c)^2) up to the scatter of the
    noise.
    """
    size = field.shape[0]
    k, count = wavenumbers(size)
    power = np.abs(np.fft.rfftn(field)) ** 2 / size ** 3
    shell = np.rint(k).astype(np.int64)
    top = size // 2
    inside = (shell >= 1) & (shell <= top)
    weights = np.bincount(shell[inside], count[inside], top + 1)
    sums = np.bincount(shell[inside], (power * count)[inside], top + 1)
    return np.arange(1, top + 1, dtype=np.float64), sums[1:] / weights[1:]


def write_universe(path: str | Path, samples: int, universe: Universe,
                   val_fraction: float = 0.2, description: str | None = None) -> None:
    """Write ``samples`` synthetic universes as a targets dataset, one sample at a time.

    Samples 0 .. N - V - 1 are the training split, the last V = round(``val_fraction`` · N)
    the held-out split (none when ``val_fraction`` is 0). Memory holds one sample. The
    file's description says how the set was made unless ``description`` replaces it.

    Raises
    ------
    DatasetError
        Fewer than one sample, a fraction that leaves a split empty, or a sample that does not
        fit in memory (:meth:`Universe.check_memory`).
    OutputError
        As :func:`hpctrain.data.dataset_writer.write_dataset`.
    """
    if samples < 1:
        raise DatasetError(f"--universe {samples} must be at least 1 sample")
    if not 0 <= val_fraction < 1:
        raise DatasetError(f"--val-fraction {val_fraction} must be in [0, 1)")
    held_out = round(val_fraction * samples)
    if val_fraction > 0 and not 1 <= held_out < samples:
        raise DatasetError(f"--val-fraction {val_fraction} of {samples} samples leaves an empty "
                           f"split; choose a fraction that keeps both splits non-empty")
    universe.check_memory()
    train = samples - held_out
    sizes = {"train": train} | ({"val": held_out} if held_out else {})

    def batches() -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        for index in range(samples):
            volume, targets = universe.sample(index)
            yield ("train" if index < train else "val"), volume[None], targets[None]

    write_batches(path, universe.sample_shape, sizes, batches(), targets=universe.targets,
                  description=universe.describe(samples) if description is None else description)
