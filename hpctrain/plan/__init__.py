"""Plans as data and how they are chosen: a layer's plan entry and the ``--grid`` specs and
plan files that give one, where every layer's tensors sit under a plan, the prices of a net's
candidates, the exact planner, and the baseline strategies."""
