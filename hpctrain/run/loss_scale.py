"""Dynamic loss scaling for float16 training: scale → unscale → one overflow flag per step,
agreed by every rank → skip and back off, or grow after a run of clean steps.

float16's largest value is 65504 and its smallest normal 6.1e-5: the gradients of a deep net
fall below that range long before they stop mattering. The loss (and so every gradient) is
multiplied by a scale S before the backward; the optimizer divides the summed gradients by S
in float32. A gradient that overflowed float16 (Inf or NaN on any rank) means S was too large:
every rank skips the update and halves S. After ``growth_interval`` clean steps in a row S
doubles, so it finds the largest scale that does not overflow, as PyTorch's ``GradScaler``.

The flag costs one wait and one small all-reduce per step: each rank sums "non-finite" over
its gradient shards on the device, reads that one number, and the ranks take the maximum.
Gradients are checked after their sums, so ranks holding the same shard see the same values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpctrain.errors import UserError

INITIAL_SCALE = 2.0**16  # PyTorch's GradScaler's default
GROWTH_INTERVAL = 2000


@dataclass
class LossScale:
    """The scale a step multiplies its loss by, and what happened to it.

    ``skipped``: the steps (counted from 1) whose update was skipped for an overflow.
    """

    scale: float = INITIAL_SCALE
    growth_interval: int = GROWTH_INTERVAL
    backoff: float = 0.5
    growth: float = 2.0
    clean: int = 0  # clean steps since the last change
    skipped: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise UserError(f"--loss-scale {self.scale} must be positive")
        if self.growth_interval < 1:
            raise UserError(f"the loss scale's growth interval {self.growth_interval} must be "
                            f"at least 1")

    def overflowed(self, grads: list[Any], comm: Any, backend: Any) -> bool:
        """Whether any gradient in ``grads`` on any rank of ``comm`` holds Inf or NaN.
        Collective: one device-to-host read of one number, one all-reduce."""
        from mpi4py import MPI

        xp, count = backend.xp, None
        for g in grads:
            if g is None:
                continue
            bad = (~xp.isfinite(g)).any()
            count = bad if count is None else count | bad
        local = 0 if count is None else int(backend.to_numpy(count))  # the one wait
        return bool(comm.allreduce(local, op=MPI.MAX))

    def update(self, overflowed: bool, step: int) -> None:
        """After step ``step`` (from 1): back off and note it, or count a clean step and grow
        after ``growth_interval`` of them."""
        if overflowed:
            self.scale *= self.backoff
            self.clean = 0
            self.skipped.append(step)
            return
        self.clean += 1
        if self.clean >= self.growth_interval:
            self.scale *= self.growth
            self.clean = 0
