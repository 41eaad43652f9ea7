"""The cost model's constants fitted to training steps: what a step really does, per layer.

Microbenchmarks time each kernel and collective alone (after a cache eviction, in a loop), which
is not what a training step sees: one machine's step ran a third faster than its kernels timed
alone, another's a third slower. Every run already records, per layer, step and direction, the
time it computed and the time it spent in communication, on the slowest rank. This module fits
the profile's constants to those times by least squares, all at once:

- **compute**, per layer kind and direction: a factor on the times the model takes from the
  kernels (or FLOPs); a kind the runs never ran takes its class's
  (:func:`~hpctrain.model.kinds.compute_class`: matrix products, or memory-bound kernels), the
  mean of that class's factors weighted by their time;
- **communication**: every time the model prices is linear in four groups of constants — the
  α and the β of the links inside a node, and of the network between nodes
  (:func:`~hpctrain.cost.machine.scaled_links`) — so a layer's predicted communication is
  x₁·A₁ + x₂·B₁ + x₃·A₂ + x₄·B₂, its four columns priced with one group at its value and the
  rest at zero.

Each row is one layer and direction of one measured plan: its measured compute plus
communication ≈ factor(kind, direction) × predicted compute + Σ xₖ·columnₖ. The slowest rank's
whole time per layer, waiting included, is what adds up to the step: fitted so, the factors
make the model's sum over layers the step the runs measured (a communication's wait for a slow
rank lands on the links' factors, as it does on the step). The least squares are of absolute
times, so the layers that make the step weigh most, and non-negative (Lawson and Hanson's
active set), so no factor turns a cost into a gain.

The fitted profile says where each constant came from (its ``sources``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from hpctrain.cost.machine import Machine, scaled_links
from hpctrain.model.kinds import compute_class
from hpctrain.plan.plans import LayerPlan

if TYPE_CHECKING:
    from hpctrain.plan.pricing import CostModel

FLOOR = 0.05
"""No fitted factor is below this. Steps may find a kernel or a message several times cheaper
than it timed alone (warm caches, work overlapped), but not free; a factor at this floor says
the runs measured too little of it to tell."""

COLUMNS = ("alpha inside a node", "beta inside a node", "alpha between nodes",
           "beta between nodes")
"""The four groups of a profile's link constants the communication times are linear in."""


@dataclass(frozen=True)
class LayerSample:
    """One layer (or the loss) of one measured plan, in one direction: what the fit needs."""

    kind: str
    backward: bool
    predicted: float  # compute, s, before any compute_scale
    columns: tuple[float, float, float, float]  # communication per unit of each COLUMNS group
    measured: float  # compute and communication, the slowest rank's


@dataclass(frozen=True)
class StepFit:
    """Factors on a profile's constants: compute per kind (forward, backward), and on the α
    and β inside a node and between nodes."""

    compute: dict[str, tuple[float, float]]
    links: tuple[float, float, float, float]
    layers: int  # samples fitted
    plans: int  # measured plans they came from

    def applied_to(self, machine: Machine, source: str) -> Machine:
        """``machine`` with these factors on its links and, as its compute scale, these
        factors (they are fitted to the times before any scale: they replace it); ``source``
        says where the times came from."""
        x = self.links
        fitted = scaled_links(machine, (x[0], x[1]), (x[2], x[3]))
        scale = {**machine.compute_scale, **self.compute}
        sources = dict(machine.sources)
        sources["links"] = (f"{machine.sources.get('links', 'microbenchmarks')}, then alpha x "
                            f"{x[0]:.3g}, beta x {x[1]:.3g} inside a node"
                            + (f", alpha x {x[2]:.3g}, beta x {x[3]:.3g} between nodes"
                               if machine.levelled else "")
                            + f" fitted to {source}")
        sources["compute"] = (f"kernels or FLOPs times factors per kind fitted to {source}")
        return replace(fitted, compute_scale=scale, sources=sources)


def communication_columns(model_of: Callable[[Machine], CostModel], plans: list[LayerPlan],
                          machine: Machine) -> np.ndarray:
    """(layers + loss, 2 directions, 4): each layer's predicted communication and
    redistribution, forward and backward, with one :data:`COLUMNS` group of ``machine``'s
    constants kept and the others zero. ``model_of(machine)`` builds the cost model of the
    measured run on a profile."""
    from hpctrain.plan.planner import choices_of, evaluate

    columns = []
    for keep in range(len(COLUMNS)):
        factors = [1.0 if k == keep else 0.0 for k in range(len(COLUMNS))]
        model = model_of(scaled_links(machine, tuple(factors[:2]), tuple(factors[2:])))
        planned = evaluate(model, choices_of(model, plans), timed=False)
        columns.append([[c.comm[d] + c.redistribution[d] for d in (0, 1)]
                        for c in [*planned.layers, planned.loss]])
    return np.transpose(np.array(columns), (1, 2, 0))


def fit(samples: Sequence[LayerSample], plans: int = 1) -> StepFit:
    """The factors that fit ``samples`` best (see the module's text); 1 for a kind and
    direction with no predicted compute, and for a group of links no layer uses."""
    if not samples:
        raise ValueError("no layer times to fit")
    keys = sorted({(s.kind, s.backward) for s in samples if s.predicted > 0})
    matrix = np.zeros((len(samples), len(keys) + len(COLUMNS)))
    for i, s in enumerate(samples):
        if s.predicted > 0:
            matrix[i, keys.index((s.kind, s.backward))] = s.predicted
        matrix[i, len(keys):] = s.columns
    factors = nonnegative_least_squares(matrix, np.array([s.measured for s in samples]),
                                        FLOOR)
    compute: dict[str, list[float]] = {}
    for (kind, backward), factor in zip(keys, factors, strict=False):
        compute.setdefault(kind, [1.0, 1.0])[int(backward)] = factor
    # a kind the runs never ran takes its class's factor: the mean of its class's kinds',
    # weighted by their predicted time (as their pooled least squares would)
    weights: dict[tuple[str, bool], float] = {}
    for s in samples:
        weights[s.kind, s.backward] = weights.get((s.kind, s.backward), 0.0) + s.predicted
    for group in sorted({compute_class(kind) for kind, _ in keys}):
        pair = []
        for backward in (False, True):
            mine = [(compute[k][int(b)], w) for (k, b), w in weights.items()
                    if b == backward and k in compute and compute_class(k) == group and w > 0]
            total = sum(w for _, w in mine)
            pair.append(sum(f * w for f, w in mine) / total if total else 1.0)
        compute[group] = pair
    return StepFit({k: (f, b) for k, (f, b) in compute.items()},
                   tuple(factors[len(keys):]), len(samples), plans)


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
    norms = np.linalg.norm(matrix[:, used], axis=0)
    a = matrix[:, used] / norms  # unit columns: seconds per message and per byte differ by 10⁴
    x = np.zeros(a.shape[1])
    active = np.zeros(a.shape[1], dtype=bool)
    tol = 1e-12 * max(float(np.linalg.norm(measured)), 1e-300)
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
                   measured: np.ndarray) -> list[LayerSample]:
    """The samples of one measured plan: per row (each layer, then the loss) and direction,
    its kind, predicted compute ((rows, 2)), communication columns ((rows, 2, 4)) and
    measured compute and communication ((rows, 2))."""
    return [LayerSample(kind, bool(d), float(p[d]), tuple(float(v) for v in c[d]), float(m[d]))
            for kind, p, c, m in zip(kinds, predicted_compute, columns, measured, strict=True)
            for d in (0, 1)]
