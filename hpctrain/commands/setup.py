"""What every command that runs a network on the launched ranks sets up before its first step:
the threads per rank, the backend, the per-layer plan and its predicted costs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.comm.agree import agreed, on_root
from hpctrain.device.threads import ThreadChoice, configure_threads
from hpctrain.model.net import NetSpec
from hpctrain.plan.plans import LayerPlan, plan_from_spec


@dataclass
class Setup:
    """A network ready to run: its plan on this world, where it runs and what was predicted."""

    net: NetSpec
    plan: list[LayerPlan]
    backend: Any
    threads: ThreadChoice
    planned: Any = None  # PlannedNetwork with the predictions, or None when not asked for
    machine: Any = None  # the cost model's machine profile
    memory: float = 0.0  # predicted peak bytes per rank (checked against what it may use)
    kernels_timed: int = 0  # kernels timed while planning (their arrays count in the peak)


def set_up(args: argparse.Namespace, net: NetSpec, comm: Any, dtype: str,
           predict: bool = True) -> Setup:
    """Threads, backend and the plan of ``net`` for ``args.grid`` (collective over ``comm``).

    With ``--grid auto`` the planner searches (measuring compute under the threads just set)
    among the plans that fit the memory a rank may use, and rank 0 writes the plan file;
    otherwise the given plan's memory is checked, then it is costed when ``predict``. Nothing
    is timed or allocated before the memory check.
    """
    import numpy as np

    from hpctrain.cost.memory import check_memory, memory_limit
    from hpctrain.device.backend import make_backend
    from hpctrain.plan.planner import plan_memory

    threads = configure_threads(comm, args.threads)
    procs = comm.Get_size()
    spec = args.grid or f"1x{procs}"
    plan = None if spec.strip() == "auto" else agreed(
        comm, lambda: plan_from_spec(spec, net, procs))
    limit, source = memory_limit(comm, args.mem_per_rank, threads.ranks_on_node)
    itemsize = np.dtype(dtype).itemsize
    memory = 0.0
    if plan is not None:
        fixed = plan_memory(net, plan, args.batch, procs, itemsize)
        check_memory(fixed, limit, source)
        memory = fixed.memory
    backend = make_backend(args.device, dtype, comm)
    if plan is not None and not predict:
        return Setup(net, plan, backend, threads, memory=memory)
    from hpctrain.cost.machine import load_machine
    from hpctrain.plan.planner import predict as predict_plan
    from hpctrain.plan.pricing import build_cost_model

    machine = agreed(comm, lambda: load_machine(args.machine))
    model = build_cost_model(net, args.batch, procs, machine, args.compute, backend, comm,
                             threads, getattr(args, "overlap", False))
    planned = predict_plan(model, plan, limit, source)
    if plan is None:  # rank 0 writes; a failed write stops every rank
        on_root(comm, lambda: write_plan_file(plan_file_path(args, net, procs), net, planned,
                                              procs, args.batch, model.machine.name))
    return Setup(net, planned.plans, backend, threads, planned, model.machine, planned.memory,
                 getattr(model.compute, "timed", 0))


def plan_file_path(args: argparse.Namespace, net: NetSpec, procs: int) -> Path:
    """Where ``--grid auto`` writes its plan: ``--plan-file``, or runs/NET-pP-bB.plan."""
    return Path(getattr(args, "plan_file", None) or f"runs/{net.name}-p{procs}-b{args.batch}.plan")


def write_plan_file(path: str | Path, net: NetSpec, planned: Any, procs: int, batch: int,
                    machine: str) -> None:
    """The plan as a file ``--grid`` reads back, with a header saying what it was made for."""
    from hpctrain.plan.plans import write_plan

    write_plan(Path(path), net, planned.plans,
               f"hpctrain plan: net {net.name}, {procs} processes, batch {batch}, machine "
               f"{machine}\npredicted iteration {planned.iteration_time * 1e3:.3f} ms")
    print(f"plan written to {path} (use it with --grid {path})", flush=True)
