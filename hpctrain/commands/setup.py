"""What every command that runs a network on the launched ranks sets up before its first step:
the threads per rank, the backend, the per-layer plan and its predicted costs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.comm.agree import agreed, on_root
from hpctrain.cost.machine import Machine, sums_in_flight, warning_lines
from hpctrain.device.backend import Backend
from hpctrain.device.threads import ThreadChoice, configure_threads
from hpctrain.model.net import NetSpec
from hpctrain.plan.planner import PlannedNetwork
from hpctrain.plan.plans import LayerPlan, plan_from_spec


@dataclass(frozen=True)
class SetupRequest:
    """What a command asks :func:`set_up` for, from its flags (each flag's help says more).

    ``grid``: the ``--grid`` value (None: pure batch, 1×P); ``plan_file``: where ``--grid auto``
    writes its plan (None: ``runs/NET-pP-bB.plan``); ``overlap``: gradient sums in flight
    (``--overlap``: auto, on or off; :func:`~hpctrain.cost.machine.sums_in_flight`), which the
    planner prices and the run does.
    """

    grid: str | None
    batch: int
    device: str = "cpu"
    dtype: str = "fp32"  # a precision name (hpctrain.device.precision; float32 is fp32)
    threads: int | None = None
    machine: str | None = None
    compute: str = "auto"
    mem_per_rank: float | None = None
    overlap: str | bool = "auto"
    plan_file: str | None = None
    space: str = "auto"  # --space: what --grid auto searches (hpctrain.plan.spaces)
    collectives: str = "auto"  # --collectives: auto, nccl or mpi (hpctrain.comm.transport)
    branches: str = "auto"  # --branches: regions on groups of ranks (auto) or not (serial)
    steps: int | None = None  # the run's length, which --space auto weighs planning against
    inference: bool = False  # the forward pass alone (predict): what is planned and priced
    retime: bool = False  # --retime: every kernel timed afresh, whatever the cache holds
    optimizer: str = "sgd"  # --optimizer: the state each parameter keeps (memory)
    accumulate: int = 1  # --accumulate: batch is the micro-batch; gradient sums kept (memory)

    @classmethod
    def from_flags(cls, args: Any, dtype: str, overlap: str | bool = "auto",
                   plan_file: str | None = None, steps: int | None = None) -> SetupRequest:
        """The request the shared flags (:func:`hpctrain.commands.flags.add_planning_options`,
        :func:`~hpctrain.commands.flags.add_run_options`, ``--batch``) give, in ``dtype``, for
        a run of ``steps`` steps (None: not known)."""
        return cls(args.grid, args.batch, args.device, dtype, args.threads, args.machine,
                   args.compute, args.mem_per_rank, overlap, plan_file, args.space,
                   args.collectives, getattr(args, "branches", "auto"), steps,
                   retime=getattr(args, "retime", False),
                   optimizer=getattr(args, "optimizer", "sgd"))


@dataclass
class Setup:
    """A network ready to run: its plan on this world, where it runs and what was predicted."""

    net: NetSpec
    plan: list[LayerPlan]
    backend: Backend
    threads: ThreadChoice
    planned: PlannedNetwork | None = None  # the predictions, or None when not asked for
    machine: Machine | None = None  # the cost model's machine profile, when it predicted
    memory: float = 0.0  # predicted peak bytes per rank (checked against what it may use)
    kernels_timed: int = 0  # kernels timed while planning (their arrays count in the peak)
    overlap: bool = False  # the gradient sums go in flight (the request's, resolved)
    # the bytes a rank may use and where that figure comes from, agreed once at set-up
    limit: tuple[float, str] | None = None
    # what the plan's output says of the figures it rests on (a profile measured on a busy
    # machine, kernels timed while another process ran)
    warnings: tuple[str, ...] = ()


def write_auto_plan(request: SetupRequest, net: NetSpec, planned: PlannedNetwork,
                    machine_name: str, comm: Any) -> None:
    """Write the plan ``--grid auto`` chose to its plan file (``--plan-file``, or its default
    name): rank 0 writes, and a failed write stops every rank. Collective."""
    from hpctrain.device.precision import resolve_precision

    procs = comm.Get_size()
    path = plan_file_path(request.plan_file, net, procs, request.batch,
                          resolve_precision(request.dtype, request.device).name)
    on_root(comm, lambda: write_plan_file(path, net, planned, procs, request.batch,
                                          machine_name))


def set_up(request: SetupRequest, net: NetSpec, comm: Any, predict: bool = True) -> Setup:
    """Threads, backend and the plan of ``net`` for ``request.grid`` (collective over ``comm``).

    With ``--grid auto`` the planner searches (measuring compute under the threads just set)
    among the plans that fit the memory a rank may use, and rank 0 writes the plan file;
    otherwise the given plan's memory is checked, then it is costed when ``predict``. Nothing
    is timed or allocated before the memory check.
    """
    from hpctrain.cost.memory import check_memory, memory_limit
    from hpctrain.device.backend import make_backend
    from hpctrain.device.precision import resolve_precision
    from hpctrain.plan.planner import plan_memory

    threads = configure_threads(comm, request.threads)
    procs = comm.Get_size()
    spec = request.grid or f"1x{procs}"
    plan = None if spec.strip() == "auto" else agreed(
        comm, lambda: plan_from_spec(spec, net, procs))
    limit, source = memory_limit(comm, request.mem_per_rank, threads.ranks_on_node)
    precision = resolve_precision(request.dtype, request.device)
    memory = 0.0
    if plan is not None:
        fixed = plan_memory(net, plan, request.batch, procs, precision, request.inference,
                            request.optimizer, request.accumulate)
        check_memory(fixed, limit, source)
        memory = fixed.memory
    backend = make_backend(request.device, request.dtype, comm, request.collectives)
    if plan is not None and not predict:
        return Setup(net, plan, backend, threads, memory=memory,
                     overlap=sums_in_flight(request.overlap, None), limit=(limit, source))
    from hpctrain.comm.nodes import check_placement
    from hpctrain.cost.machine import load_machine
    from hpctrain.plan.pricing import build_cost_model, timing_warnings
    from hpctrain.plan.spaces import predict as predict_plan

    machine = agreed(comm, lambda: load_machine(request.machine))
    check_placement(comm, machine)
    overlap = sums_in_flight(request.overlap, machine)
    model = build_cost_model(net, request.batch, procs, machine, request.compute, backend, comm,
                             threads, overlap, inference=request.inference,
                             retime=request.retime, optimizer=request.optimizer,
                             accumulate=request.accumulate)
    planned = predict_plan(model, plan, limit, source, request.space,
                           request.branches == "auto", request.steps)
    if plan is None:
        write_auto_plan(request, net, planned, model.machine.name, comm)
    warnings = (*warning_lines(model.machine), *timing_warnings(model))
    return Setup(net, planned.plans, backend, threads, planned, model.machine, planned.memory,
                 getattr(model.compute, "timed", 0), overlap, (limit, source), warnings)


def plan_file_path(plan_file: str | None, net: NetSpec, procs: int, batch: int,
                   precision: str, what: str = "") -> Path:
    """Where ``--grid auto`` writes its plan: ``--plan-file``, or
    runs/NET-pP-bB-sSIZE-PRECISION.plan (NET the net's file name without its folder and suffix:
    ``model`` for ``../models/model.onnx``, so that the default stays in runs/; SIZE the
    sample's spatial size, ``224`` or ``768x1152``, absent for flat inputs; PRECISION the
    resolved ``--precision``), ``-what`` before the suffix when given (predict's). The size and
    precision are in the name because the plan depends on them: a run at another image size
    must not overwrite this one's plan."""
    if plan_file:
        return Path(plan_file)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(net.name).name)
    stem = stem.removesuffix(".net").removesuffix(".onnx") or "net"
    spatial = net.input_shape[1:]
    size = ("" if not spatial else f"-s{spatial[0]}" if len(set(spatial)) == 1
            else f"-s{'x'.join(map(str, spatial))}")
    return Path(f"runs/{stem}-p{procs}-b{batch}{size}-{precision}"
                f"{f'-{what}' if what else ''}.plan")


def write_plan_file(path: str | Path, net: NetSpec, planned: PlannedNetwork, procs: int,
                    batch: int, machine: str) -> None:
    """The plan as a file ``--grid`` reads back, with a header saying what it was made for."""
    from hpctrain.plan.plans import write_plan

    write_plan(Path(path), net, planned.plans,
               f"hpctrain plan: net {net.name}, {procs} processes, batch {batch}, machine "
               f"{machine}, precision {planned.precision.name}\npredicted iteration "
               f"{planned.iteration_time * 1e3:.3f} ms")
    print(f"plan written to {path} (use it with --grid {path})", flush=True)
