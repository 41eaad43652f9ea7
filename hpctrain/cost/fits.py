"""The α–β line of a collective's times and where large messages bend it, fitted to timed sweeps.

A sweep of message sizes nᵢ, timed tᵢ, is fitted by a line ``t = a + b·n`` in relative error
(:func:`fit_line`); past the sizes that fit in the caches the line bends at a knee to a second
slope (:func:`fit_knee`). :func:`line_to_fit` divides ``a`` and ``b`` by the message and byte
terms of the collective's formula (:func:`hpctrain.cost.collectives.terms`), so the cost model's
prediction at a measured size is the fitted line itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpctrain.cost.collectives import terms
from hpctrain.cost.machine import Fit

MIN_A = 1e-9  #: smallest intercept a fit may return (s), keeping α > 0 when noise pulls it below 0
MIN_B = 1e-14  #: smallest slope a fit may return (s/B, 100 TB/s), keeping β > 0 likewise


def fit_knee(a: float, b: float, sizes: Sequence[float], times: Sequence[float],
             start: float) -> tuple[float, float]:
    """``(knee, s)``: past the size ``knee`` each byte costs ``s``, where the line ``a + b·n``
    fitted below ``start`` no longer holds.

    The times at ``sizes`` (all above ``start``) are priced ``a + b·min(n, K) + s·max(0, n − K)``.
    The knee K is ``start`` or one of ``sizes`` but the last, and ``s`` (at least
    :data:`MIN_B`) minimises the relative squared error of the times past K; the K whose pricing
    has the smallest relative squared error over every time wins. On a network whose bandwidth
    does not fall with size, ``s`` comes out near ``b``.
    """
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    best = (math.inf, float(start), b)
    for knee in [float(start), *n[:-1]]:
        past = n > knee
        w2 = 1.0 / t[past] ** 2
        d = n[past] - knee
        slope = max(MIN_B, float(np.sum(w2 * d * (t[past] - a - b * knee)) / np.sum(w2 * d * d)))
        error = float(np.sum(((bent_line(a, b, knee, slope, n) - t) / t) ** 2))
        if error < best[0]:
            best = (error, knee, slope)
    return best[1], best[2]


def bent_line(a: float, b: float, knee: float, slope: float, sizes: Any) -> np.ndarray:
    """``a + b·min(n, knee) + slope·max(0, n − knee)`` at each size n: the price of a fit
    (:meth:`~hpctrain.cost.machine.Fit.seconds`) with the line's own a and b as its α and β."""
    line = Fit(a, b, knee, slope)
    return np.array([line.seconds(1.0, float(n)) for n in sizes])


def fit_line(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """``(a, b)`` minimising Σ((a + b·nᵢ − tᵢ)/tᵢ)², with a ≥ :data:`MIN_A`, b ≥ :data:`MIN_B`.

    The error is relative so a 64-byte message (microseconds) weighs as much as a 4 MiB one
    (milliseconds): an absolute fit would let the large messages set ``a`` and lose the latency.
    When the unconstrained optimum has ``a`` or ``b`` below its floor (noise at a size where the
    term is negligible), that parameter is held at its floor and the other refitted alone.

    Parameters
    ----------
    sizes : message sizes nᵢ in bytes, at least two distinct.
    times : measured seconds tᵢ > 0, one per size.
    """
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape:
        raise ValueError(f"fit_line needs one time per size, got {n.shape} and {t.shape}")
    if np.unique(n).size < 2:
        raise ValueError(f"fit_line needs at least two distinct sizes, got {n.tolist()}")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError(f"fit_line needs positive finite times, got {t.tolist()}")
    w = 1.0 / t
    # columns of equal magnitude keep the least-squares problem well conditioned
    scale = float(n.max())
    design = np.stack([w, w * n / scale], axis=1)
    (a, b_scaled), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    a, b = float(a), float(b_scaled) / scale
    w2 = w * w
    if a < MIN_A:
        a = MIN_A
        b = float(np.sum(w2 * n * (t - a)) / np.sum(w2 * n * n))
    if b < MIN_B:
        b = MIN_B
        a = max(MIN_A, float(np.sum(w2 * (t - b * n)) / np.sum(w2)))
    return a, b


def worst_residual(sizes: Sequence[float], times: Sequence[float], a: float, b: float,
                   knee: float = math.inf, slope: float = 0.0) -> float:
    """``max |price(nᵢ) − tᵢ| / tᵢ``: how far the fit (the line ``a + b·n``, bent at ``knee`` to
    ``slope``) strays from the worst measured point."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    return float(np.max(np.abs(bent_line(a, b, knee, slope, n) - t) / t))


def fit_collective(collective: str, p: int, sizes: Sequence[float],
                   times: Sequence[float]) -> Fit:
    """α and β of ``collective`` on ``p`` ranks from times measured at ``sizes`` (bytes).

    The line ``t = a + b·n`` is fitted by :func:`fit_line`; :func:`line_to_fit` turns it into
    α and β such that the cost model reproduces the fitted line.
    """
    return line_to_fit(collective, p, *fit_line(sizes, times))


def line_to_fit(collective: str, p: int, a: float, b: float, knee: float = math.inf,
                slope: float = 0.0) -> Fit:
    """α = a/m and β = b/c, with ``(m, c)`` the model's terms
    (:func:`~hpctrain.cost.collectives.terms`); past ``knee`` bytes of message (c·knee bytes of
    byte terms), far β = slope/c."""
    m, c = terms(collective, p)
    if math.isfinite(knee):
        return Fit(a / m, b / c, c * knee, slope / c)
    return Fit(a / m, b / c)
