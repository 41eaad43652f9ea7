"""One rule for seeds: an integer in [0, 2**63), wherever a seed is given or read back.

A seed keys the counter-based generator (:mod:`hpctrain.kernels.counter_rng`, which takes words
modulo 2**64, so -1 would alias 2**64 - 1), NumPy's ``default_rng`` (which refuses negative
seeds) for a dataset's epoch order and held-out split, and an int64 attribute in checkpoints and
run logs. Non-negative integers below 2**63 suit all four, and every such seed draws its own
stream: a seed refused by one data source is refused by every one.
"""

from __future__ import annotations

import argparse
import operator

from hpctrain.errors import UserError

SEED_LIMIT = 1 << 63  # seeds are 0 .. SEED_LIMIT - 1


def check_seed(seed: object, what: str = "--seed") -> int:
    """``seed`` as an int when it is an integer in [0, 2**63); a :class:`~hpctrain.errors.UserError`
    otherwise.

    Examples
    --------
    >>> check_seed(7)
    7
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    hpctrain.errors.UserError: --seed -1 must be an integer in [0, 2**63)
    """
    try:
        value = operator.index(seed)  # ints and NumPy integers; not floats or bools' lookalikes
    except TypeError:
        value = None
    if value is None or isinstance(seed, bool) or not 0 <= value < SEED_LIMIT:
        raise UserError(f"{what} {seed} must be an integer in [0, 2**63)")
    return value


def parse_seed(text: str) -> int:
    """argparse ``type`` for ``--seed``: the rule above, as a usage error."""
    try:
        return check_seed(int(text))
    except (ValueError, UserError):
        raise argparse.ArgumentTypeError(f"'{text}' is not a seed; give an integer in "
                                         f"[0, 2**63)") from None
