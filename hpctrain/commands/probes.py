"""Training steps of a few probe plans, timed layer by layer, to fit a fresh profile to.

``calibrate`` measures every collective and a GEMM alone, then (unless ``--quick``) trains a
few steps of each plan ``compare-plans`` would compare, on small probe nets, under the profile
it just wrote, and refits that profile to the per-layer times (:mod:`hpctrain.record.refit`):
what a training step really does on this machine, with this launch, fitted by least squares.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any

from hpctrain.cost.machine import Machine
from hpctrain.errors import UserError
from hpctrain.plan.stepfit import StepFit
from hpctrain.record.refit import PricedPlan, refit

PROBE_NETS = ("smallcnn:32,alexnet:64,minibranch:32,minivolume:24,minimobile:32,"
              "smallcnn:192")
"""The probe nets by default, as ``NAME:IMAGE_SIZE``. A small CNN, AlexNet's large kernels,
strides, pools and wide linear layers at an image size that runs in seconds, a small branched
net of what Inception and ResNet are made of (pointwise and factorised convolutions, batch
norm, concat, add), a small volume net (3-D convolutions, pools and batch norm), a small mobile
net (depthwise and grouped convolutions, a squeeze-excitation gate, the mobile activations),
and the small
CNN again on images whose layers no longer fit a rank's share of the cache (their factors are
fitted apart: :data:`~hpctrain.model.kinds.BEYOND_CACHE`). Each convolution's window shape
takes a factor of its own (:func:`~hpctrain.model.kinds.shape_class`)."""
PROBE_BATCH = 16
PROBE_STEPS = 4  # the first is a warm-up, as in compare-plans


def parse_probe_nets(text: str) -> list[tuple[str, int | None]]:
    """``NAME[:SIZE],…`` as (name, image size or None); ``none``: no probes. A name is a shipped
    net, a ``.net`` file or an ONNX model (``model.onnx:64``): a user's own net probes too."""
    if text.strip() == "none":
        return []
    found = []
    for item in text.split(","):
        name, _, size = item.strip().partition(":")
        if not name or (size and not size.isdigit()):
            raise UserError(f"--probe-nets: {item!r} is not NAME or NAME:IMAGE_SIZE (for "
                            f"example {PROBE_NETS}); or give none")
        found.append((name, int(size) if size else None))
    return found


def fit_to_probe_steps(profile: Path, machine: Machine, nets: list[tuple[str, int | None]],
                       device: str, threads: int | None, comm: Any, say,
                       precision: str = "fp32", collectives: str = "auto"
                       ) -> tuple[Machine, StepFit, list[PricedPlan]]:
    """``machine`` (saved at ``profile``) refitted to a few training steps of every plan
    compare-plans compares, on each of ``nets``, trained in ``precision`` with
    ``collectives``; collective over ``comm``."""
    from hpctrain.commands.compare_plans import compare
    from hpctrain.device.precision import resolve_precision
    from hpctrain.record.measured import measured_plan

    measured = []
    for name, size in nets:
        args = Namespace(net=name, image_size=size, batch=PROBE_BATCH, steps=PROBE_STEPS,
                         rounds=1, kernel_timing="once", plans=None, device=device,
                         precision=precision, collectives=collectives, log=None,
                         threads=threads, overlap=False, machine=str(profile),
                         mem_per_rank=None, space="grids", branches="auto", compute="measured",
                         bn_group="global", loss="auto")
        say(f"probe steps: {name}{f' {size}' if size else ''}, every plan compare-plans "
            f"compares, {PROBE_STEPS} steps each")
        outcomes, net, _ = compare(args, comm, quiet=True)
        procs = comm.Get_size()
        measured += [measured_plan(f"{name} {o.spec}", net, PROBE_BATCH, procs,
                                   resolve_precision(precision, device).itemsize, machine,
                                   o.planned, o.layer_times, o.fastest_rank,
                                   o.measured_iteration) for o in outcomes]
    names = ", ".join(f"{n}{f' {s}' if s else ''}" for n, s in nets)
    return refit(measured, machine, f"the per-layer times of {len(measured)} probe plans of "
                                    f"{names} on {comm.Get_size()} ranks")
