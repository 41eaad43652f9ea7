"""The whole-network strategies that the planner's per-layer plans are measured against,
defined once.

A strategy lays every weighted layer of a net out from one Pr×Pc grid (the paper's Sec. 3,
Gholami et al., SPAA 2018); "convolutions" are the weighted kinds that can split the image
height (domain mode):

- ``1.5d``: every weighted layer model-parallel on Pr×Pc (Eq. 8; Pc = 1 is model parallelism,
  Eq. 3; Pr = 1 batch parallelism, Eq. 4);
- ``conv-batch``: the convolutions batch-parallel on 1×P, the other weighted layers 1.5D on
  Pr×Pc;
- ``integrated``: the convolutions domain-parallel on Pr×Pc (height over Pr, batch over Pc), the
  other weighted layers 1.5D (Eq. 9; Eq. 7 when Pc = 1).

With Pr = 1 every layer is batch-parallel on 1×P. The two baselines people know are two of
these: *pure batch* (data parallelism) is ``1.5d`` on 1×P, and Krizhevsky's *one weird trick*
(2014) is ``conv-batch`` on P×1: convolutions batch-parallel, fully connected layers
model-parallel.

Used by the paper's equations (:mod:`hpctrain.plan.paper`), the study (``simulate``), the
planner's one-grid plan for nets too densely connected to search, and ``compare-plans``, which
runs each as the ``--grid`` value :func:`grid_spec` spells.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.model.kinds.base import Kind
from hpctrain.plan.plans import LayerPlan

#: The names of the whole-network strategies this module defines.
STRATEGIES = ("1.5d", "conv-batch", "integrated")


def _check(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use {', '.join(STRATEGIES)}")


def is_convolution(kind: Kind) -> bool:
    """Whether the strategies treat layers of ``kind`` as convolutions: it can be
    domain-parallel."""
    return "domain" in kind.modes


def strategy_plan(kinds: Sequence[Kind], strategy: str, grid: tuple[int, int]
                  ) -> list[LayerPlan]:
    """The plan entry of each weighted layer, given by its kind in net order, under
    ``strategy`` (one of :data:`STRATEGIES`) on ``grid``."""
    _check(strategy)
    pr, pc = grid
    whole = LayerPlan("batch", (1, pr * pc))
    if pr == 1:
        return [whole] * len(kinds)
    split = LayerPlan("model", grid)
    conv = {"1.5d": split, "conv-batch": whole, "integrated": LayerPlan("domain", grid)}[strategy]
    return [conv if is_convolution(kind) else split for kind in kinds]


def pure_batch(kinds: Sequence[Kind], procs: int) -> list[LayerPlan]:
    """Every weighted layer batch-parallel on 1×P: ``1.5d`` on 1×P."""
    return strategy_plan(kinds, "1.5d", (1, procs))


def weird_trick(kinds: Sequence[Kind], procs: int) -> list[LayerPlan]:
    """Krizhevsky's "one weird trick" (2014): convolutions batch-parallel on 1×P, the fully
    connected layers model-parallel on P×1, i.e. ``conv-batch`` on P×1."""
    return strategy_plan(kinds, "conv-batch", (procs, 1))


BASELINES = {"pure_batch": pure_batch, "weird_trick": weird_trick}


def grid_spec(strategy: str, grid: tuple[int, int]) -> str:
    """``strategy`` on ``grid`` as a ``--grid`` value: ``RxC``, ``conv=1xP,fc=RxC`` or
    ``conv=domain:RxC,fc=RxC``. (Run so, a convolution too short to cut R ways runs ``model``
    on the same grid instead, and a linear layer narrower than R ``replicated``; see
    :mod:`hpctrain.plan.plans`.)"""
    _check(strategy)
    pr, pc = grid
    rxc = f"{pr}x{pc}"
    return {"1.5d": rxc, "conv-batch": f"conv=1x{pr * pc},fc={rxc}",
            "integrated": f"conv=domain:{rxc},fc={rxc}"}[strategy]
