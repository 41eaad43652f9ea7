"""The last buckets of gradient sums: every communicator's, sent together when the backward
ends, the step waiting for the slowest; and an exact search that weighs them.

The gradient reducer (:mod:`hpctrain.comm.gradients`) packs a layer's gradients into the bucket
of its communicator and sums a bucket with one all-reduce once it holds ``bucket_bytes``. Each
layer's own price pays its bytes and its byte share of one all-reduce's latency
(:func:`~hpctrain.cost.collectives.gradient_sum_seconds`), which adds up to the full buckets'
latencies. What is left in each communicator's bucket goes when the backward ends: every such
bucket is started at once and the step waits for them all, so it pays the largest of their
latencies, whole, and never hidden behind compute (there is none left). A net smaller than a
bucket thus pays one all-reduce's latency, not its byte share of one, and no plan is predicted
below the latency of the slowest communicator it sums gradients over. Each layer's price knows the
latency of the slowest communicator it sums over (``LayerCost.bucket_latency``).

The term is not a sum over layers, so :func:`least_with_last_buckets` keeps the search exact
around the additive search (every layer's own price). A plan's time is its additive time A plus
the latency μ of its slowest communicator. Let ``p`` be the additive optimum among the plans
whose communicators are all faster than some bound (at first: every plan). A plan of that set
whose slowest communicator is no faster than ``p``'s has A no less and μ no less, so it does not
beat ``p``: only the plans whose every communicator is faster than ``p``'s slowest can, and the
search repeats among them. It stops when none is left, or when even their additive optimum is
no faster than the best plan found. Each round drops at least one latency, so there are at most
as many rounds as distinct latencies (a few: one per size of group), and usually one or two.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def slowest_latency(costs) -> float:
    """The latency of one all-reduce on the slowest communicator the layers of ``costs``
    (:class:`~hpctrain.plan.pricing.LayerCost`) sum gradients over (0 when they sum none): what
    their last buckets cost the step."""
    return max((c.bucket_latency for c in costs), default=0.0)


def least_with_last_buckets(search: Callable[[float, float], object | None],
                            additive: Callable[[object], float],
                            slowest: Callable[[object], float]) -> object | None:
    """The plan of least time, its additive time plus ``slowest(plan)``, exactly (the module's
    text). ``search(below, under)``: the plan of least additive time among those whose every
    communicator's latency is below ``below``; None when there is none, and it may be None when
    none has additive time under ``under`` (the best time found so far: such a plan cannot win,
    so a search may prune with it); ``additive(plan)`` that time. None when the first search
    finds no plan."""
    best, best_time, below = None, math.inf, math.inf
    while (plan := search(below, best_time)) is not None:
        least = additive(plan)
        if least >= best_time:
            break  # the rest have more additive time than the best has in all
        latency = slowest(plan)
        if least + latency < best_time:
            best, best_time = plan, least + latency
        if latency == 0.0:
            break  # nothing left is faster
        below = latency
    return best
