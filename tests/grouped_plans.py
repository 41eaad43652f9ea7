"""Plans that put the branches of fork–join regions on disjoint groups of ranks, for the tests
of operations side by side."""

from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.kinds import KINDS
from hpctrain.model.regions import fork_join_regions
from hpctrain.plan.grouped import blocks
from hpctrain.plan.placement import plan_layouts
from hpctrain.plan.plans import LayerPlan


def entries(size):
    """Splits a weighted layer may take on a group of ``size`` ranks, cycled through: every
    1.5D mode on every grid, a height and width split, input-channel splits."""
    found = [LayerPlan("batch", (1, size))]
    for grid in factorisations(size):
        if grid[0] > 1:
            found += [LayerPlan("model", grid), LayerPlan("domain", grid)]
    return found


def grouped_plan(net, procs, batch, offset=0, world=None):
    """A plan of ``net`` on ``procs`` ranks with the weighted branches of every outermost
    region whose fork runs on every rank on blocks of ranks (:func:`blocks`), branch b on
    block b mod the number of blocks; inside its group each weighted layer takes the next of
    :func:`entries` (from ``offset``) that its sizes allow, else the batch split. Layers
    outside the regions take ``world`` (a layer plan; batch on every rank by default)."""
    world = world or LayerPlan("batch", (1, procs))
    plan = [world if KINDS[spec.kind].weighted else LayerPlan("follow") for spec in net.layers]
    taken: set[int] = set()
    for region in fork_join_regions(net):
        weighted = [b for b in region.branches
                    if any(KINDS[net.layers[k].kind].weighted for k in b)]
        if len(weighted) < 2 or taken & set(region.inside) or region.fork in taken:
            continue
        groups = blocks(procs, len(weighted))
        for b, branch in enumerate(weighted):
            first, size = groups[b % len(groups)]
            for k in branch:
                if KINDS[net.layers[k].kind].weighted:
                    cycle = entries(size)
                    plan[k] = cycle[(offset + k) % len(cycle)].on_ranks((first, size))
        taken |= set(region.inside)
    for _ in range(len(plan)):  # a split the sizes cannot take: the group's batch split
        try:
            plan_layouts(net, plan, batch, procs)
            return plan
        except SplitError as err:
            named = [j for j, spec in enumerate(net.layers)
                     if KINDS[spec.kind].weighted and f"layer {spec.name}" in str(err)]
            bad = max(named, key=lambda j: len(net.layers[j].name))  # the longest name named
            ranks = plan[bad].ranks
            plan[bad] = LayerPlan("batch", (1, ranks[1] if ranks else procs), ranks=ranks)
    plan_layouts(net, plan, batch, procs)  # raises if still no plan runs
    return plan
