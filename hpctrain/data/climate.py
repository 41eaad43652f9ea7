"""Synthetic climate-like fields with labelled features: a stand-in for DeepCAM's CAM5 data.

A sample is C fields (channels) of H x W, like DeepCAM's 16 variables on a 768 x 1152 grid, and a
label map of H x W with DeepCAM's three classes: 0 background, 1 atmospheric river, 2 tropical
cyclone. Sample i of a set with seed s draws everything from ``numpy.random.default_rng([s,
i])``, so any sample can be made alone and is the same whoever makes it:

1. a background per channel: a few smooth waves across the grid (large-scale weather), of
   random wavenumber, phase and amplitude, plus white noise of a tenth of their size;
2. atmospheric rivers (0 to 2): long, narrow bands, a Gaussian ridge about a line across the
   grid at a random angle, width a thirtieth of the grid; they raise the moisture channels
   (the first third) by 2·exp(−d²/2w²), d the distance to the line;
3. tropical cyclones (0 to 3): compact vortices of radius ρ a fortieth of the grid; they lower
   the pressure channels (the second third) by 2·exp(−r²/2ρ²) and raise the wind channels (the
   rest) by 2·(r/ρ)·exp(1 − r/ρ), largest on the ring r = ρ, r the distance to the centre.

A pixel is labelled 2 within 1.5 radii of a cyclone's centre, else 1 within 1.5 widths of a
river's line, else 0: the classes are as unbalanced as DeepCAM's (most pixels background), which
is why its loss weights them (``--class-weights``). The features are visible in the fields, so a
net learns them in a few steps.
"""

from __future__ import annotations

import numpy as np

CLASSES = ("background", "atmospheric river", "tropical cyclone")


def climate_sample(seed: int, index: int, channels: int, height: int, width: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``index`` of the set ``seed``: (fields (C, H, W) float32, labels (H, W) int64)."""
    rng = np.random.default_rng([seed, index])
    y, x = np.meshgrid(np.linspace(0.0, 1.0, height), np.linspace(0.0, 1.0, width),
                       indexing="ij")
    fields = np.empty((channels, height, width))
    for c in range(channels):
        k = rng.uniform(1.0, 4.0, size=(3, 2))
        phase = rng.uniform(0.0, 2 * np.pi, size=3)
        amplitude = rng.uniform(0.2, 1.0, size=3)
        fields[c] = sum(a * np.sin(2 * np.pi * (ky * y + kx * x) + p)
                        for (ky, kx), p, a in zip(k, phase, amplitude, strict=True))
    fields += 0.1 * rng.standard_normal(fields.shape)
    labels = np.zeros((height, width), dtype=np.int64)
    moisture = slice(0, max(1, channels // 3))
    pressure = slice(max(1, channels // 3), max(2, 2 * channels // 3))
    wind = slice(max(2, 2 * channels // 3), channels)
    scale = min(height, width) / max(height, width)  # the grid's aspect, in units of its width
    for _ in range(rng.integers(0, 3)):  # atmospheric rivers
        angle = rng.uniform(0.0, np.pi)
        cy, cx = rng.uniform(0.2, 0.8, size=2)
        w = 1 / 30
        d = np.abs((y - cy) * np.cos(angle) * scale - (x - cx) * np.sin(angle))
        fields[moisture] += 2.0 * np.exp(-(d / w) ** 2 / 2)
        labels[d < 1.5 * w] = 1
    for _ in range(rng.integers(0, 4)):  # tropical cyclones
        cy, cx = rng.uniform(0.1, 0.9, size=2)
        rho = 1 / 40
        r = np.hypot((y - cy) * scale, x - cx) / rho
        fields[pressure] -= 2.0 * np.exp(-(r ** 2) / 2)
        fields[wind] += 2.0 * r * np.exp(1 - r)
        labels[r < 1.5] = 2
    return fields.astype(np.float32), labels


def climate_set(count: int, channels: int, height: int, width: int, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
    """``count`` samples: fields (N, C, H, W) float32 and label maps (N, H, W) int64."""
    images = np.empty((count, channels, height, width), dtype=np.float32)
    labels = np.empty((count, height, width), dtype=np.int64)
    for i in range(count):
        images[i], labels[i] = climate_sample(seed, i, channels, height, width)
    return images, labels
