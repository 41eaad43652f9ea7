"""Setting up redistributions at scale: one rank's plan of every move, in pure Python (no MPI).

For AlexNet and VGG-16 under the plans the planner picks at P = 4096, B = 2048 (FLOP-rate
compute on a machine profile, as ``hpctrain plan`` does away from that machine), plans every move
the network runs (each layer's feed, then the logits to the loss) for rank 0 and a middle rank,
as :class:`~hpctrain.comm.redistribute.Redistribute` does when it is built; then the move of
AlexNet's conv3 input from a channel split on 4×(P/4) to a batch split on 1×P, at P and P/2.
Prints each move's method and piece counts and the total time, and for contrast the time of the
global piece list that every rank once built, at P = 256 (under a second; O(P²) beyond).

    python bench/moves.py --procs 4096 --batch 2048 --machine cori-knl
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from hpctrain.cost.machine import load_machine
from hpctrain.layout.layout import CHANNEL_AXIS, Layout
from hpctrain.layout.moves import (
    AllGatherMove,
    GeneralMove,
    Move,
    SliceMove,
    move_between,
    transfer_pieces,
)
from hpctrain.model.net import load_net
from hpctrain.plan.placement import input_layout, move_pairs, plan_layouts
from hpctrain.plan.planner import plan_network
from hpctrain.plan.pricing import build_cost_model


def rank_part(move: Move, rank: int) -> object:
    """What ``rank`` does in ``move``, as Redistribute sets it up."""
    if isinstance(move, GeneralMove):
        return move.exchange(rank)
    if isinstance(move, AllGatherMove):
        return move.gathered(rank)
    if isinstance(move, SliceMove):
        return move.slices(rank)
    return None


def counts(part: object) -> str:
    """sends/receives/kept pieces of a general move's part (a dash for the other methods)."""
    if not hasattr(part, "sends"):
        return "-"
    return f"{len(part.sends)}/{len(part.receives)}/{len(part.local)}"


def timed_plans(pairs: list[tuple[Layout, Layout]], ranks: tuple[int, ...]
                ) -> tuple[list[Move], list[list[object]], float]:
    """Each move, each rank's part in it, and the seconds all of them took."""
    start = time.perf_counter()
    moves = [move_between(src, dst) for src, dst in pairs]
    parts = [[rank_part(move, rank) for rank in ranks] for move in moves]
    return moves, parts, time.perf_counter() - start


def network_moves(name: str, procs: int, batch: int, machine_name: str, ranks: tuple[int, ...]
                  ) -> float:
    """Plan ``name``, print its moves for ``ranks``, and return the seconds their plans took."""
    net = load_net(name)
    machine = load_machine(machine_name)
    start = time.perf_counter()
    planned = plan_network(build_cost_model(net, batch, procs, machine, "flops"))
    planning = time.perf_counter() - start
    pairs = move_pairs(net, plan_layouts(net, planned.plans, batch, procs),
                       input_layout(net, planned.plans, batch, procs))
    moves, parts, seconds = timed_plans(pairs, ranks)
    fed = [layer.name for layer in net.layers for _ in layer.inputs] + ["loss"]
    print(f"\n{name}: {len(pairs)} moves under the auto plan (planned in {planning:.2f} s); "
          f"sends/receives/kept pieces per rank")
    print(f"  {'feeds':<10} {'method':<10} {'from':<28} {'to':<28} "
          + " ".join(f"{'rank ' + str(r):>12}" for r in ranks))
    for layer, (src, dst), move, row in zip(fed, pairs, moves, parts, strict=True):
        if not move.moves_data:
            continue
        print(f"  {layer:<10} {move.method:<10} {src.describe():<28} {dst.describe():<28} "
              + " ".join(f"{counts(p):>12}" for p in row))
    methods = Counter(move.method for move in moves)
    print(f"  methods: {dict(methods)}; {len(pairs) * len(ranks)} plans in {seconds * 1e3:.1f} ms")
    return seconds


def channel_split_to_batch(procs: int, batch: int) -> tuple[Layout, Layout]:
    """AlexNet's conv3 input, channel-split on 4×(P/4) (conv2 in model mode) → 1×P."""
    net = load_net("alexnet")
    conv3 = next(k for k, layer in enumerate(net.layers) if layer.name == "conv3")
    shape = (batch, *net.shapes()[conv3])
    return Layout(shape, (4, procs // 4), CHANNEL_AXIS), Layout(shape, (1, procs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--machine", default="cori-knl")
    parser.add_argument("--contrast-procs", type=int, default=256,
                        help="P at which to time the old global piece list for contrast")
    args = parser.parse_args()
    ranks = (0, args.procs // 2 - 1)
    print(f"move plans at P = {args.procs}, B = {args.batch}, ranks {ranks}")
    total = sum(network_moves(name, args.procs, args.batch, args.machine, ranks)
                for name in ("alexnet", "vgg16"))
    for procs in (args.procs, args.procs // 2):  # at B < P half the 1×P ranks hold nothing
        src, dst = channel_split_to_batch(procs, args.batch)
        pair_ranks = (0, procs // 2 - 1)
        moves, parts, seconds = timed_plans([(src, dst)], pair_ranks)
        total += seconds
        print(f"\nalexnet conv3 input {src.shape} on P = {procs}: {src.describe()} -> "
              f"{dst.describe()}: {moves[0].method}, sends/receives/kept "
              + ", ".join(f"rank {r} {counts(p)}" for r, p in zip(pair_ranks, parts[0],
                                                                   strict=True))
              + f" in {seconds * 1e3:.2f} ms")
    print(f"\ntotal: every plan above in {total * 1e3:.1f} ms (target under 500 ms)")
    src, dst = channel_split_to_batch(args.contrast_procs, args.batch)
    start = time.perf_counter()
    pieces = transfer_pieces(src, dst)
    print(f"for contrast, the global piece list of that move at P = {args.contrast_procs} "
          f"({len(pieces)} pieces, O(P²), once on every rank): "
          f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
