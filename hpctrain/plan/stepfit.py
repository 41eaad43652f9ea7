"""The cost model's constants fitted to training steps: what a step really does, per layer.

Microbenchmarks time each kernel and collective alone (after a cache eviction, in a loop), which
is not what a training step sees: one machine's step ran a third faster than its kernels timed
alone, another's a third slower. Every run already records, per layer, step and direction, the
time it computed and the time it spent in communication, on the slowest rank. This module fits
the profile's constants to those times by least squares, all at once:

- **compute**, per layer kind, direction and size of work (within the cache or beyond it:
  :data:`~hpctrain.model.kinds.BEYOND_CACHE`, the size fitted by :func:`fit_cache_bytes`): a
  factor on the times the model takes from the kernels (or FLOPs); a kind the runs never ran
  takes its class's (:func:`~hpctrain.model.kinds.compute_class`: matrix products, or
  memory-bound kernels) for its size, the mean of that class's factors weighted by their time;
- **communication**: every time the model prices is linear in four groups of constants — the
  α and the β of the links inside a node, and of the network between nodes
  (:func:`~hpctrain.cost.machine.scaled_links`) — so a layer's predicted communication is
  x₁·A₁ + x₂·B₁ + x₃·A₂ + x₄·B₂, its four columns priced with one group at its value and the
  rest at zero.

Each row is one layer and direction of one measured plan: its measured compute plus
communication ≈ factor(kind, size, direction) × predicted compute + Σ xₖ·columnₖ. The slowest
rank's whole time per layer, waiting included, is what adds up to the step: fitted so, the
factors make the model's sum over layers the step the runs measured (a communication's wait for
a slow rank lands on the links' factors, as it does on the step). The least squares are of
absolute times, each row's square times a weight (the refit gives each plan's rows the inverse
square of its step, so every plan counts alike: :func:`hpctrain.record.refit.refit`), so within
a plan the layers that make the step weigh most; non-negative (Lawson and Hanson's active
set), so no factor turns a cost into a gain; and pulled towards 1, the microbenchmarks, as
hard as predicting each probe net from the others says: the microbenchmarks count, for every
factor, as much as ``pull`` plans made of that factor's work alone
(:func:`hpctrain.record.refit.pulled_fit` chooses it).

The fitted profile says where each constant came from (its ``sources``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from hpctrain.cost.machine import Machine, scaled_links
from hpctrain.model.kinds import beyond_cache, compute_class, kind_of, scale_key
from hpctrain.plan.plans import LayerPlan

if TYPE_CHECKING:
    from hpctrain.plan.planner import PlannedNetwork
    from hpctrain.plan.pricing import CostModel

FLOOR = 0.05
"""No fitted factor is below this. Steps may find a kernel or a message several times cheaper
than it timed alone (warm caches, work overlapped), but not free; a factor at this floor says
the runs measured too little of it to tell."""

COLUMNS = ("alpha inside a node", "beta inside a node", "alpha between nodes",
           "beta between nodes")
"""The four groups of a profile's link constants the communication times are linear in."""

CACHE_CANDIDATES = 32
"""The most splits :func:`fit_cache_bytes` tries, spread over the sizes, each one fit."""
SPLIT_GAIN = 0.1
"""The share of the squared error without a split that a split must remove to be kept."""
CLASS_SHARE = 0.1
"""The least share of the predicted compute either side of a split must hold. A split that
sets a few layers apart would fit their noise, not a cache."""


@dataclass(frozen=True)
class LayerSample:
    """One layer (or the loss) of one measured plan, in one direction: what the fit needs."""

    kind: str
    backward: bool
    predicted: float  # compute, s, before any compute_scale
    columns: tuple[float, float, float, float]  # communication per unit of each COLUMNS group
    measured: float  # compute and communication, the slowest rank's
    touched: float = 0.0  # bytes its work reads and writes (LocalWork.touched_elements)


@dataclass(frozen=True)
class StepFit:
    """Factors on a profile's constants: compute per kind (forward, backward), and on the α
    and β inside a node and between nodes."""

    compute: dict[str, tuple[float, float]]
    links: tuple[float, float, float, float]
    layers: int  # samples fitted
    plans: int  # measured plans they came from
    cache_bytes: int = 0  # work touching more takes the factors beyond the cache; 0: none
    pull: float = 0.0  # how hard the factors were pulled towards 1 (_pull_weight)

    def applied_to(self, machine: Machine, source: str) -> Machine:
        """``machine`` with these factors on its links and, as its compute scale, these
        factors (they are fitted to the times before any scale: they replace it); ``source``
        says where the times came from."""
        x = self.links
        pulled = f", pulled towards 1 by {self.pull:g}" if self.pull else ""
        fitted = scaled_links(machine, (x[0], x[1]), (x[2], x[3]))
        scale = {**machine.compute_scale, **self.compute}
        sources = dict(machine.sources)
        sources["links"] = (f"{machine.sources.get('links', 'microbenchmarks')}, then alpha x "
                            f"{x[0]:.3g}, beta x {x[1]:.3g} inside a node"
                            + (f", alpha x {x[2]:.3g}, beta x {x[3]:.3g} between nodes"
                               if machine.levelled else "")
                            + f" fitted to {source}{pulled}")
        sources["compute"] = f"kernels or FLOPs times factors per kind fitted to {source}{pulled}"
        return replace(fitted, compute_scale=scale, sources=sources,
                       cache_bytes=self.cache_bytes)


def communication_columns(model_of: Callable[[Machine], CostModel], plans: list[LayerPlan],
                          machine: Machine) -> np.ndarray:
    """(layers + loss, 2 directions, 4): each layer's predicted communication and
    redistribution, forward and backward, with one :data:`COLUMNS` group of ``machine``'s
    constants kept and the others zero. ``model_of(machine)`` builds the cost model of the
    measured run on a profile."""
    return columns_of(evaluated_per_column(model_of, plans, machine))


def evaluated_per_column(model_of: Callable[[Machine], CostModel], plans: list[LayerPlan],
                         machine: Machine) -> list[PlannedNetwork]:
    """``plans`` evaluated, untimed, once for each :data:`COLUMNS` group: on ``machine`` with
    that group of its constants kept and the others zero (what :func:`columns_of` reads)."""
    from hpctrain.plan.planner import evaluate_plan

    evaluated = []
    for keep in range(len(COLUMNS)):
        factors = [1.0 if k == keep else 0.0 for k in range(len(COLUMNS))]
        model = model_of(scaled_links(machine, tuple(factors[:2]), tuple(factors[2:])))
        evaluated.append(evaluate_plan(model, plans, timed=False))
    return evaluated


def columns_of(evaluated: Sequence[PlannedNetwork]) -> np.ndarray:
    """:func:`communication_columns` of the evaluations :func:`evaluated_per_column` made."""
    columns = [[[c.comm[d] + c.redistribution[d] for d in (0, 1)]
                for c in [*planned.layers, planned.loss]] for planned in evaluated]
    return np.transpose(np.array(columns), (1, 2, 0))


def fit(samples: Sequence[LayerSample], plans: int = 1,
        weights: Sequence[float] | None = None, cache_bytes: int = 0,
        pull: float = 0.0) -> StepFit:
    """The factors that fit ``samples`` (of ``plans`` plans) best (see the module's text),
    each sample's squared error times its weight in ``weights`` (None: all 1), work touching
    more than ``cache_bytes`` (0: none) with factors of its own, each factor pulled towards 1
    by ``pull`` (as much as ``pull`` plans of its work alone that ran at 1 would); 1 for a kind
    and direction with no predicted compute, and for a group of links no layer uses."""
    return _fit(samples, plans, weights, cache_bytes, pull)[0]


def _pull_weight(matrix: np.ndarray, pull: float, plans: int) -> float:
    """The weight s of the rows s·(xₖ − 1), one per factor of the weighted ``matrix`` (the rows
    of ``plans`` plans), that pull every factor towards 1, the microbenchmarks' own value:
    √(pull·U), where U is one plan's worth of the rows' squares (their sum over ``plans``). The
    microbenchmarks then count, for every factor, as much as ``pull`` plans made of that
    factor's work alone: a factor the rows hold much of (convolutions, over every plan) keeps
    close to where the times put it, one they hold little of (the few small convolutions within
    the cache) stays near 1. 0: no pull.

    Why: the times a factor is fitted to are a handful of kernels, each timed once, and a
    kernel's timing varies from one process to the next by more than a kind's real departure
    from its microbenchmark. Fitted freely on five probe nets, a factor learns those kernels'
    timing errors (×1.4 on 3-D convolutions one calibrate, ×0.9 the next) and carries them to
    every other net; a factor of a few rows went to ×4. How hard to pull is chosen by leaving
    one probe net out at a time (:func:`hpctrain.record.refit.pulled_fit`)."""
    return math.sqrt(pull * float(np.sum(matrix * matrix)) / max(plans, 1))


def _fit(samples: Sequence[LayerSample], plans: int, weights: Sequence[float] | None,
         cache_bytes: int, pull: float = 0.0) -> tuple[StepFit, float]:
    """:func:`fit`, and the weighted sum of its squared errors on ``samples``."""
    if not samples:
        raise ValueError("no layer times to fit")
    sample_keys = [_scale_key(s, cache_bytes) for s in samples]
    keys = sorted({(key, s.backward) for s, key in zip(samples, sample_keys, strict=True)
                   if s.predicted > 0})
    index = {key: k for k, key in enumerate(keys)}
    # each sample's column of compute factors (None: it predicts no compute)
    column = [index[key, s.backward] if s.predicted > 0 else None
              for s, key in zip(samples, sample_keys, strict=True)]
    matrix = np.zeros((len(samples), len(keys) + len(COLUMNS)))
    for i, s in enumerate(samples):
        if column[i] is not None:
            matrix[i, column[i]] = s.predicted
        matrix[i, len(keys):] = s.columns
    weight = np.ones(len(samples)) if weights is None else np.asarray(weights, float)
    root = np.sqrt(weight)
    rows, measured = matrix * root[:, None], np.array([s.measured for s in samples]) * root
    if pull > 0:
        pull_weight, unknowns = _pull_weight(rows, pull, plans), rows.shape[1]
        rows = np.vstack([rows, pull_weight * np.eye(unknowns)])
        measured = np.concatenate([measured, np.full(unknowns, pull_weight)])
    factors = nonnegative_least_squares(rows, measured, FLOOR)
    links = tuple(factors[len(keys):])
    residual = 0.0  # the weighted sum of squared errors, sample by sample
    for i, s in enumerate(samples):
        factor = factors[column[i]] if column[i] is not None else 0.0
        error = s.predicted * factor + float(np.dot(s.columns, links)) - s.measured
        residual += weight[i] * error * error
    compute: dict[str, list[float]] = {}
    for (key, backward), factor in zip(keys, factors, strict=False):
        compute.setdefault(key, [1.0, 1.0])[int(backward)] = factor
    # a kind the runs never ran takes its class's factor (of work its size): the mean of its
    # class's kinds', weighted by their predicted time (as their pooled least squares would);
    # a shape class they never ran its kind's, where they ran the kind in other shapes only
    weights_of: dict[tuple[str, bool], float] = {}
    pools: dict[str, set[str]] = {}  # each key's pooled keys: its class's, its kind's
    for s, key in zip(samples, sample_keys, strict=True):
        weights_of[key, s.backward] = weights_of.get((key, s.backward), 0.0) + s.predicted
        beyond = beyond_cache(s.touched, cache_bytes)
        pools[key] = {scale_key(compute_class(s.kind), beyond), scale_key(kind_of(s.kind), beyond)}
    for group in sorted({g for key, _ in keys for g in pools[key]} - set(compute)):
        pair = []
        for backward in (False, True):
            mine = [(compute[k][int(b)], w) for (k, b), w in weights_of.items()
                    if b == backward and k in compute and group in pools[k] and w > 0]
            total = sum(w for _, w in mine)
            pair.append(sum(f * w for f, w in mine) / total if total else 1.0)
        compute[group] = pair
    return StepFit({k: (f, b) for k, (f, b) in compute.items()}, links, len(samples), plans,
                   cache_bytes, pull), float(residual)


def fit_cache_bytes(samples: Sequence[LayerSample], plans: int = 1,
                    weights: Sequence[float] | None = None, pull: float = 0.0) -> StepFit:
    """:func:`fit` with the ``cache_bytes`` that fits ``samples`` best, or none (each fit
    with ``pull``).

    Where a step stops finding a layer's data in cache is the machine's (its cache, and who
    else uses it: a virtual machine may report a host's 480 MiB), so it is fitted too: every
    split between two sizes of work the samples hold (at their geometric middle, at most
    :data:`CACHE_CANDIDATES` of them) that leaves each side at least :data:`CLASS_SHARE` of
    the predicted compute, and none; the least weighted squared error wins, a split only when
    it removes :data:`SPLIT_GAIN` of the error without one."""
    weight = np.ones(len(samples)) if weights is None else np.asarray(weights, float)
    timed = [(s.touched, s.predicted * w) for s, w in zip(samples, weight, strict=True)
             if s.predicted > 0 and s.touched > 0]
    sizes = np.array(sorted({t for t, _ in timed}))
    total = sum(p for _, p in timed)
    below = np.array([sum(p for t, p in timed if t <= size) for size in sizes])
    eligible = [k for k in range(len(sizes) - 1)
                if CLASS_SHARE * total <= below[k] <= (1 - CLASS_SHARE) * total]
    if len(eligible) > CACHE_CANDIDATES:
        eligible = [eligible[round(i)] for i in
                    np.linspace(0, len(eligible) - 1, CACHE_CANDIDATES)]
    best, error = _fit(samples, plans, weights, 0, pull)
    scale = float(np.dot(weight, [s.measured ** 2 for s in samples]))
    # a split must earn its second set of factors: a tenth of the error without one
    least = (1 - SPLIT_GAIN) * error - 1e-20 * scale
    for k in eligible:
        candidate, error = _fit(samples, plans, weights,
                                int(math.sqrt(sizes[k] * sizes[k + 1])), pull)
        if error < least:
            best, least = candidate, error
    return best


def _scale_key(sample: LayerSample, cache_bytes: int) -> str:
    """The ``compute_scale`` key ``sample`` is fitted under: its kind, for its size."""
    return scale_key(sample.kind, beyond_cache(sample.touched, cache_bytes))


def nonnegative_least_squares(matrix: np.ndarray, measured: np.ndarray, floor: float = 0.0
                              ) -> list[float]:
    """x ≥ ``floor`` minimising the squared norm of matrix·x − measured (for y = x − floor ≥ 0,
    Lawson and Hanson's active set: add the column whose gradient most wants to grow, solve on
    the active ones, step back to the boundary where one would go negative, repeat). A column
    all zero gets 1: nothing the runs did says otherwise."""
    if floor:
        found = nonnegative_least_squares(matrix, measured - matrix.sum(axis=1) * floor)
        return [x + floor if np.any(matrix[:, k] != 0) else 1.0 for k, x in enumerate(found)]
    used = np.any(matrix != 0, axis=0)
    tol = 1e-12 * max(float(np.linalg.norm(measured)), 1e-300)
    norms = np.linalg.norm(matrix[:, used], axis=0)
    a = matrix[:, used] / norms  # unit columns: seconds per message and per byte differ by 10⁴
    if a.shape[0] > a.shape[1]:
        # the same squares, less what no x changes, on as many rows as columns: with
        # a = QR, |a·x − measured|² = |R·x − Qᵀ·measured|² + a constant (the fit's choice of
        # pull solves thousands of rows some ten thousand times)
        q, a = np.linalg.qr(a)
        measured = q.T @ measured
    x = np.zeros(a.shape[1])
    active = np.zeros(a.shape[1], dtype=bool)
    for _ in range(3 * a.shape[1] + 1):
        gradient = a.T @ (measured - a @ x)
        if active.all() or gradient[~active].max() <= tol:
            break
        active[np.argmax(np.where(active, -np.inf, gradient))] = True
        while True:
            z = np.zeros_like(x)
            z[active] = np.linalg.lstsq(a[:, active], measured, rcond=None)[0]
            if (z[active] > 0).all():
                x = z
                break
            falling = active & (z <= 0)
            with np.errstate(invalid="ignore", divide="ignore"):  # 0/0: a column just added
                step = float(np.nan_to_num(np.min(x[falling] / (x[falling] - z[falling]))))
            x = x + step * (z - x)
            active &= x > tol
            x[~active] = 0.0
    found = iter(x / norms)
    return [float(next(found)) if u else 1.0 for u in used]


def samples_of_run(kinds: Iterable[str], predicted_compute: np.ndarray, columns: np.ndarray,
                   measured: np.ndarray, touched: Iterable[float] | None = None
                   ) -> list[LayerSample]:
    """The samples of one measured plan: per row (each layer, then the loss) and direction,
    its kind, predicted compute ((rows, 2)), communication columns ((rows, 2, 4)), measured
    compute and communication ((rows, 2)) and the bytes its work touches (None: not known)."""
    kinds = list(kinds)
    sizes = [0.0] * len(kinds) if touched is None else list(touched)
    return [LayerSample(kind, bool(d), float(p[d]), tuple(float(v) for v in c[d]), float(m[d]),
                        float(size))
            for kind, p, c, m, size in zip(kinds, predicted_compute, columns, measured, sizes,
                                           strict=True)
            for d in (0, 1)]
