"""``python -m hpctrain verify``: check a plan against the serial computation, one forward and
backward, layer by layer."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.commands.flags import add_planning_options, add_run_options, check_space
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import Backend
from hpctrain.errors import ArgumentParser, UserError
from hpctrain.layers.base import Layer
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetSpec
from hpctrain.plan.plans import LayerPlan
from hpctrain.run.network import Network


def largest(a: np.ndarray) -> float:
    """``max |a|`` (0 for an empty array)."""
    return float(np.abs(a).max()) if a.size else 0.0


def relative_error(got: np.ndarray, want: np.ndarray, floor: float = 0.0) -> float:
    """``max |got − want| / max(max |want|, floor)`` (the absolute error where both are 0)."""
    scale = max(largest(want), floor)
    diff = largest(got - want) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def serial_plan(plan: list[LayerPlan]) -> list[LayerPlan]:
    return [p if p.mode == "follow" else LayerPlan("batch", (1, 1)) for p in plan]


@dataclass
class LayerState:
    """One layer's output, input gradients (one per input), parameter gradients and buffers
    after the step, whole (on rank 0); on one process, when asked, the magnitude of the sum
    each parameter gradient and buffer is (by full name, see :meth:`Kind.magnitudes
    <hpctrain.model.kinds.base.Kind.magnitudes>`)."""

    output: np.ndarray | None
    input_grads: list[np.ndarray | None] | None
    param_grads: dict[str, np.ndarray | None]
    buffers: dict[str, np.ndarray | None]
    magnitudes: dict[str, np.ndarray] = field(default_factory=dict)


def run_step(network: Network, data: SyntheticData, step: int = 0, magnitudes: bool = False
             ) -> tuple[float, list[LayerState]]:
    """Forward + backward of batch ``step``; every tensor gathered whole on rank 0. With
    ``magnitudes`` (one process: every array is whole), each layer's state also holds the
    magnitudes of its parameter gradients' and buffers' sums."""
    be, comm = network.backend, network.grids.world
    outputs: list = []
    grads: list = []
    output_grads: list | None = [] if magnitudes else None
    loss, _ = network.train_step(data, step, outputs, grads, output_grads=output_grads)
    network.settle_buffers()
    states = []
    for layer, y, dx in zip(network.layers, outputs, grads, strict=True):
        states.append(_gather_layer(be, comm, layer, y, dx))
    if magnitudes:
        net, host = network.net, be.to_numpy
        batch = host(data.images(step, network.input_box))
        for k, (spec, state) in enumerate(zip(net.layers, states, strict=True)):
            xs = [batch if p < 0 else host(outputs[p]) for p in net.producers(k)]
            found = KINDS[spec.kind].magnitudes(spec, xs, host(output_grads[k]))
            state.magnitudes = {f"{spec.name}.{suffix}": m for suffix, m in found.items()}
    return loss, states


def _gather_layer(be: Backend, comm: MPI.Comm, layer: Layer, y, dx) -> LayerState:
    out = gather_to_root(be, comm, y, layer.out_layout.shape, layer.out_layout.box, "copy")
    dx_whole = None
    if dx is not None:
        dxs = dx if isinstance(dx, list) else [dx]
        dx_whole = [gather_to_root(be, comm, d, layout.shape, layout.box, "sum")
                    for d, layout in zip(dxs, layer.in_layouts, strict=True)]
    params = {p.name: gather_to_root(be, comm, p.grad, p.shape, p.box, "copy")
              for p in layer.params}
    buffers = {b.name: gather_to_root(be, comm, b.value, b.shape, b.box, "copy")
               for b in layer.buffers}
    return LayerState(out, dx_whole, params, buffers)


def _worst(got: dict, want: dict, magnitudes: dict[str, np.ndarray]) -> float | None:
    """The largest relative error over the arrays of two dicts of the same names, each against
    the larger of its own largest entry and the largest magnitude of the sum it is: the scale
    of its rounding, whatever the order of the sum. A sum that cancels (a bias gradient before
    a batch norm, zero in exact arithmetic) is so measured against its terms, not against its
    own rounding noise."""
    if not got:
        return None
    return max(relative_error(got[n], want[n],
                              largest(magnitudes[n]) if n in magnitudes else 0.0) for n in got)


def verify(net: NetSpec, plan: list[LayerPlan], batch: int, grids: GridSet, backend: Backend,
           seed: int = 0, tolerance: float = 1e-9, out=print) -> bool:
    """Compare the plan with one process; rank 0 prints a table. True on every rank if all pass."""
    comm = grids.world
    data = SyntheticData.for_net(backend, net, batch, seed)
    network = Network(net, plan, batch, grids, backend, seed)
    loss, states = run_step(network, data)
    ok = True
    if comm.Get_rank() == 0:
        with GridSet(MPI.COMM_SELF) as serial_grids:
            serial = Network(net, serial_plan(plan), batch, serial_grids, backend, seed)
            serial_loss, reference = run_step(serial, data, magnitudes=True)
        width = max(10, *(len(layer.name) for layer in network.layers))
        described = [entry.describe() for entry in plan]
        moved = [f"{layer.in_layout.describe()} -> {layer.out_layout.describe()}"
                 for layer in network.layers]
        plan_width = max(18, *map(len, described))
        moved_width = max(44, *map(len, moved))
        out(f"{'layer':<{width}} {'plan':<{plan_width}} {'layout in -> out':<{moved_width}} "
            f"{'output':>9} {'dX':>9} {'dparams':>9} {'buffers':>9}")
        worst = relative_error(np.array([loss]), np.array([serial_loss]))
        for layer, entry, layouts, got, want in zip(network.layers, described, moved, states,
                                                    reference, strict=True):
            errs = [relative_error(got.output, want.output)]
            errs.append(max(relative_error(g, w) for g, w in zip(
                got.input_grads, want.input_grads, strict=True)) if got.input_grads else None)
            errs.append(_worst(got.param_grads, want.param_grads, want.magnitudes))
            errs.append(_worst(got.buffers, want.buffers, want.magnitudes))
            worst = max([worst] + [e for e in errs if e is not None])
            cells = " ".join(f"{e:9.1e}" if e is not None else f"{'-':>9}" for e in errs)
            out(f"{layer.name:<{width}} {entry:<{plan_width}} {layouts:<{moved_width}} {cells}")
        ok = worst <= tolerance
        out(f"loss {loss:.12g} (serial {serial_loss:.12g}); largest relative error {worst:.2e} "
            f"{'<=' if ok else '>'} tolerance {tolerance:.0e}: {'PASS' if ok else 'FAIL'}")
    return bool(comm.bcast(ok, root=0))


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain verify",
        description="Run one forward and backward under a plan and the same computation on one "
                    "process in float64; print per layer the largest relative error of the "
                    "output and of every gradient; exit 1 above the tolerance.",
        epilog="Exit status: 0 when every error is within --tolerance, 1 above it, 2 for bad "
               "input (one line naming the value and the fix).")
    add_run_options(parser)
    parser.add_argument("--batch", type=int, default=4, help="global mini-batch (default: 4)")
    parser.add_argument("--tolerance", type=float, default=1e-9,
                        help="largest relative error accepted, a finite number >= 0 "
                             "(default: 1e-9)")
    add_planning_options(parser)
    return parser


def run(argv: list[str], comm) -> int:
    from hpctrain.comm.agree import agreed
    from hpctrain.commands.flags import load_net_for
    from hpctrain.commands.setup import SetupRequest, set_up

    args = build_parser().parse_args(argv)
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):  # NaN would fail every plan
        raise UserError(f"--tolerance {args.tolerance:g} must be a finite number >= 0, e.g. 1e-9")
    check_space(args, [args.grid])
    net = agreed(comm, lambda: load_net_for(args, comm.Get_size()))
    request = SetupRequest.from_flags(args, "float64")
    setup = set_up(request, net, comm, predict=False)
    with GridSet(comm) as grids:
        ok = verify(setup.net, setup.plan, args.batch, grids, setup.backend, args.seed or 0,
                    args.tolerance)
    return 0 if ok else 1
