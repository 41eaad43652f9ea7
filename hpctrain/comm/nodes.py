"""The nodes a job runs on, as MPI sees them: how many ranks share each node, and whether they
fill the nodes in blocks (rank r on node r // R), as a profile with levels assumes
(:mod:`hpctrain.cost.nodes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpctrain.cost.machine import Machine

LAUNCH_IN_BLOCKS = "launch with Slurm's --distribution=block or MPICH's mpiexec -hosts a:R,b:R"


def unblocked(even: bool, blocked: bool) -> str:
    """What keeps ranks from filling equal nodes in blocks (empty when nothing does)."""
    if not even:
        return "nodes hold different numbers of ranks"
    if not blocked:
        return "a node holds ranks that are not consecutive (round-robin placement?)"
    return ""


@dataclass(frozen=True)
class Placement:
    """``ranks_per_node``: the ranks on the fullest node; ``even``: every node holds as many;
    ``blocked``: every node holds consecutive ranks, starting at a multiple of that count."""

    ranks_per_node: int
    nodes: int
    even: bool
    blocked: bool

    def describe(self) -> str:
        return (f"{self.nodes} node{'s' if self.nodes > 1 else ''}, "
                f"{self.ranks_per_node} rank{'s' if self.ranks_per_node > 1 else ''} per node"
                + ("" if self.even and self.blocked else ", not placed in blocks"))


def placement(comm: Any, node: Any = None) -> Placement:
    """Where ``comm``'s ranks run (collective; three small all-reduces: O(log P)). ``node``:
    this rank's node communicator (``Split_type(COMM_TYPE_SHARED)``) when the caller keeps
    one; else one is made and freed here."""
    from mpi4py import MPI

    own = node is None
    if own:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        size, local = node.Get_size(), node.Get_rank()
        # the node's lowest world rank, known to its members by a broadcast from local rank 0
        first = node.bcast(comm.Get_rank() if local == 0 else None, root=0)
    finally:
        if own:
            node.Free()
    fullest = comm.allreduce(size, op=MPI.MAX)
    even = comm.allreduce(size, op=MPI.MIN) == fullest
    blocked = bool(comm.allreduce(int(first == comm.Get_rank() - local
                                      and first % fullest == 0), op=MPI.MIN))
    nodes = comm.allreduce(int(local == 0), op=MPI.SUM)
    return Placement(fullest, nodes, even, blocked)


def placement_warning(where: Placement, ranks_per_node: int) -> str | None:
    """Why a profile with levels made for nodes of ``ranks_per_node`` ranks misprices this
    job's messages, or None when it fits (a job inside one node of at most that many ranks
    fits: none of its messages leaves the node, as priced)."""
    why = unblocked(where.even, where.blocked)
    if why:
        return (f"the ranks do not fill nodes in blocks ({where.describe()}: {why}): the plan "
                f"prices model groups as consecutive ranks on one node; {LAUNCH_IN_BLOCKS}")
    if where.ranks_per_node != ranks_per_node and (where.nodes > 1
                                                   or where.ranks_per_node > ranks_per_node):
        return (f"the machine profile has {ranks_per_node} ranks per node but this job runs "
                f"{where.ranks_per_node}: launch {ranks_per_node} per node, or calibrate with "
                f"this layout")
    return None


def check_placement(comm: Any, machine: Machine) -> None:
    """With a profile with levels, print on rank 0 why this job's placement misprices it, if
    it does (collective; nothing to do for a flat profile)."""
    if not machine.levelled:
        return
    warning = placement_warning(placement(comm), machine.ranks_per_node)
    if warning and comm.Get_rank() == 0:
        print(f"warning: {warning}", flush=True)
