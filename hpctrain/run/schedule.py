"""Learning-rate schedules: the rate of every step as a pure function of the step number.

A function of the step alone, so a run resumed from a checkpoint at step s continues with
exactly the rates the uninterrupted run would have used.

``--lr-schedule`` spellings:

- ``constant``: the base rate at every step;
- ``cosine``: base · ½(1 + cos(π·t/T)) over the T steps after warm-up, decaying towards 0;
- ``step:EVERY:FACTOR``: multiplied by FACTOR every EVERY steps, e.g. ``step:30:0.1``;
- ``poly``: base · (1 − t/T)^p over the T steps after warm-up, decaying towards 0, p the
  ``--poly-power`` (2 by default, as MLPerf's LARS recipe for ResNet-50; PyTorch's
  ``PolynomialLR(total_iters=T, power=p)``).

``--warmup-steps W`` ramps linearly from base/W to the base over the first W steps, then the
schedule runs on the remaining steps. W must be fewer than the run's steps: a warm-up as long as
the run never trains at the rate asked for, so it is refused rather than warned about (a warning
line scrolls past in a batch job's output; the refusal costs nothing, before any planning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.errors import UserError

POLY_POWER = 2.0  # poly's default exponent, MLPerf's LARS recipe's
SHAPES = ("constant", "cosine", "step", "poly")  # how the rate moves after the warm-up


@dataclass(frozen=True)
class Schedule:
    """The learning rate of each step of a ``total_steps`` run.

    Examples
    --------
    >>> s = parse_schedule("step:2:0.5", base=0.1, total_steps=6)
    >>> [round(s.lr(k), 4) for k in range(6)]
    [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    >>> [round(parse_schedule("constant", 0.1, 4, warmup=2).lr(k), 3) for k in range(4)]
    [0.05, 0.1, 0.1, 0.1]
    >>> [round(parse_schedule("poly", 1.0, 5, warmup=1).lr(k), 4) for k in range(5)]
    [1.0, 1.0, 0.5625, 0.25, 0.0625]
    """

    base: float
    shape: str = "constant"
    total_steps: int = 1
    warmup: int = 0
    every: int = 1
    factor: float = 1.0
    power: float = POLY_POWER  # poly's exponent

    def lr(self, step: int) -> float:
        if step < self.warmup:
            return self.base * (step + 1) / self.warmup
        t = step - self.warmup
        if self.shape == "cosine":
            span = max(self.total_steps - self.warmup, 1)
            return self.base * 0.5 * (1 + math.cos(math.pi * min(t, span) / span))
        if self.shape == "step":
            return self.base * self.factor ** (t // self.every)
        if self.shape == "poly":
            span = max(self.total_steps - self.warmup, 1)
            return self.base * (1 - min(t, span) / span) ** self.power
        return self.base

    def describe(self) -> str:
        text = {"constant": "constant", "cosine": f"cosine over {self.total_steps} steps",
                "step": f"x{self.factor:g} every {self.every} steps",
                "poly": f"polynomial (power {self.power:g}) over {self.total_steps} steps"
                }[self.shape]
        warm = f", {self.warmup} warm-up steps" if self.warmup else ""
        return f"lr {self.base:g} {text}{warm}"


def parse_schedule(text: str, base: float, total_steps: int, warmup: int = 0,
                   power: float | None = None) -> Schedule:
    """The schedule ``text`` names (see the module docstring); errors name the bad part.
    ``power``: poly's exponent (``--poly-power``; None: 2, ``POLY_POWER``), refused with
    another schedule, which would ignore it."""
    if base <= 0 or not math.isfinite(base):
        raise UserError(f"--lr {base} must be positive")
    if warmup < 0:
        raise UserError(f"--warmup-steps {warmup} must be >= 0")
    if warmup and warmup >= total_steps:  # the rate would never reach --lr: surely a slip
        raise UserError(f"--warmup-steps {warmup} must be fewer than the run's {total_steps} "
                        f"steps, or the rate never reaches --lr {base:g}; lower it or train "
                        f"longer")
    shape, *params = text.strip().split(":")
    if shape not in SHAPES:
        raise UserError(f"--lr-schedule '{text}': unknown schedule '{shape}'; use constant, "
                        f"cosine, step:EVERY:FACTOR or poly")
    if power is not None and shape != "poly":
        raise UserError(f"--poly-power {power:g} is the exponent of --lr-schedule poly, not "
                        f"of {shape}; drop it or give --lr-schedule poly")
    if power is not None and not (math.isfinite(power) and power > 0):
        raise UserError(f"--poly-power {power} must be a positive number, such as 2")
    if shape != "step":
        if params:
            raise UserError(f"--lr-schedule '{text}': {shape} takes no parameters")
        return Schedule(base, shape, total_steps, warmup,
                        power=POLY_POWER if power is None else power)
    try:
        every, factor = int(params[0]), float(params[1])
        if len(params) != 2:
            raise ValueError
    except (IndexError, ValueError):
        raise UserError(f"--lr-schedule '{text}': write step:EVERY:FACTOR, e.g. "
                        f"step:30:0.1") from None
    if every < 1 or not 0 < factor <= 1:
        raise UserError(f"--lr-schedule '{text}': EVERY must be >= 1 and FACTOR in (0, 1]")
    return Schedule(base, shape, total_steps, warmup, every, factor)
