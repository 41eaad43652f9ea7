"""Command-line options that several commands share, spelled and documented once."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from hpctrain.errors import UserError, shown
from hpctrain.io.seeds import parse_seed
from hpctrain.io.units import bytes_from


def parse_size(text: str) -> float:
    """Bytes from '512M', '2G', '1.5GiB' or a plain byte count (K/M/G/T are powers of 1024)."""
    size = bytes_from(text)
    if not size:
        raise argparse.ArgumentTypeError(f"'{text}' is not a memory size; write e.g. 512M or 2G")
    return size


def positive_int(text: str) -> int:
    """An integer of at least 1, for counts such as --threads."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of at least 1")
    return value


def add_net_options(parser: argparse.ArgumentParser, image_size: bool = True,
                    statistics: bool = True) -> None:
    """--net, --loss and (unless told not to) --image-size and --bn-group (which only a
    command that trains reads)."""
    from hpctrain.interchange.nets import LOSSES
    from hpctrain.model.net import available_nets

    parser.add_argument("--net", default="alexnet",
                        help=f"shipped net ({', '.join(available_nets())}), a .net file, or an "
                             f"ONNX model (.onnx, as torch.onnx.export writes it; its "
                             f"initializers are the starting weights; needs the onnx extra) "
                             f"(default: %(default)s)")
    if image_size:
        parser.add_argument("--image-size", type=int, default=None,
                            help="input height and width, overriding the net's")
    parser.add_argument("--loss", choices=LOSSES, default="auto",
                        help="what the net's output is trained towards: cross-entropy over "
                             "classes, or mse, the mean squared error against targets; auto: "
                             "what the net file's input line says (classes= or targets=), or "
                             "an ONNX model's hpctrain metadata, else the dataset's labels or "
                             "targets, else cross-entropy (default: %(default)s)")
    if not statistics:
        return
    parser.add_argument("--bn-group", type=statistics_group, default="global",
                        help="which samples each batch norm takes its statistics over, unless "
                             "its line in the net file says (group=): global, the whole "
                             "mini-batch, as one process (exact under every plan); rank, each "
                             "rank's share of the batch, as PyTorch DDP; or K, the shares of K "
                             "ranks, as MLPerf's bn group (a divisor of P). The same groups of "
                             "samples under every plan, so verify compares with one process "
                             "computing them (default: %(default)s)")


def add_init_options(parser: argparse.ArgumentParser) -> None:
    """--init FILE and --init-except NAMES: starting weights from a file."""
    parser.add_argument("--init", default=None, metavar="FILE",
                        help="starting weights from an ONNX model (its initializers) or a "
                             "safetensors state dict, by PyTorch's names (layer2.0.conv1.weight"
                             "; the shipped torchvision nets take torchvision's), into any net "
                             "whose layers match: every tensor of the net must be in FILE with "
                             "its shape, and every tensor of FILE have a place in the net "
                             "(default: an ONNX --net's own, else drawn from --seed)")
    parser.add_argument("--init-except", default=None, metavar="NAMES",
                        help="comma-separated layers that keep weights drawn from --seed "
                             "instead of FILE's (a new head: --init-except fc), by hpctrain's "
                             "or PyTorch's name; FILE's tensors of those modules are left out")


def with_init(args: argparse.Namespace, net):
    """``net`` starting from ``--init`` (and ``--init-except``), checked against the file now
    (rank 0, before anything runs); ``net`` itself without ``--init``."""
    from dataclasses import replace

    from hpctrain.interchange.weights import read_weights
    from hpctrain.model.net import StartingWeights

    if args.init is None:
        if args.init_except is not None:
            raise UserError(f"--init-except {shown(args.init_except)} names layers that keep "
                            f"fresh weights instead of --init's; give --init FILE too")
        return net
    names = tuple(n.strip() for n in (args.init_except or "").split(",") if n.strip())
    if args.init_except is not None and not names:
        raise UserError(f"--init-except {shown(args.init_except)} names no layer; give "
                        f"comma-separated layer names, e.g. --init-except fc")
    net = replace(net, weights=StartingWeights(args.init, names))
    read_weights(net.weights, net)  # every refusal now, before planning
    return net


def statistics_group(text: str) -> str | int:
    """``--bn-group``: global, rank or a positive number of ranks."""
    if text in ("global", "rank"):
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not global, rank or a number of ranks "
                                         f"such as 8")
    return value


def class_weights(text: str) -> tuple[float, ...]:
    """``--class-weights``: one finite number of 0 or more per class, comma-separated."""
    try:
        weights = tuple(float(word) for word in text.split(","))
    except ValueError:
        weights = ()
    if not weights or not all(math.isfinite(w) and w >= 0 for w in weights):
        raise argparse.ArgumentTypeError(f"'{text}' is not comma-separated weights of 0 or "
                                         f"more, one per class, such as 1,2.5,0.5")
    return weights


def load_net_for(args: argparse.Namespace, procs: int):
    """The net that ``--net``, ``--image-size``, ``--loss`` and ``--bn-group`` name, on
    ``procs`` ranks."""
    from hpctrain.interchange.nets import load_network

    net = load_network(args.net, getattr(args, "image_size", None),
                       getattr(args, "loss", "auto"))
    return net.with_statistics(getattr(args, "bn_group", "global"), procs)


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """--threads: BLAS/OpenMP threads per rank (see :mod:`hpctrain.device.threads`)."""
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="BLAS/OpenMP threads per rank (default: an explicit "
                             "OMP_NUM_THREADS, else the CPUs of the rank's affinity mask when "
                             "bound, else SLURM_CPUS_PER_TASK, else the node's CPUs / ranks on "
                             "the node; at least 1)")


def add_overlap_option(parser: argparse.ArgumentParser) -> None:
    """--overlap: gradient sums in flight during the backward (see hpctrain.comm.gradients)."""
    parser.add_argument("--overlap", nargs="?", const="on", default="auto",
                        choices=("auto", "on", "off"),
                        help="on (or the bare flag): sum parameter gradients with non-blocking "
                             "all-reduces, a bucket (the machine profile's bucket_bytes, 25 MiB "
                             "by default) as soon as it is full, while the backward goes on; "
                             "pays where the network moves data by itself (RDMA) or a core is "
                             "spare for MPICH_ASYNC_PROGRESS=1; under NCCL the sums run on a "
                             "stream of their own beside the backward's kernels; the planner "
                             "counts as hidden "
                             "the share of the sums that the profile's 'overlap' says. off: "
                             "one blocking all-reduce per bucket. auto: on where the machine "
                             "profile's overlap is above 0 (the GPU clusters' profiles), else "
                             "off. The same numbers either way (default: %(default)s)")


def add_planning_options(parser: argparse.ArgumentParser) -> None:
    """--machine, --mem-per-rank and --compute: the cost model behind --grid auto."""
    from hpctrain.cost.machine import available_machines
    from hpctrain.plan.pricing import COMPUTE_SOURCES
    from hpctrain.plan.spaces import AUTO_SECONDS, AUTO_SHARE, SPACE_CHOICES

    parser.add_argument("--machine", default=None,
                        help=f"machine profile for the cost model: "
                             f"{', '.join(available_machines())} or a .toml path "
                             f"(default: local when calibrated, else default)")
    parser.add_argument("--mem-per-rank", type=parse_size, default=None,
                        help="memory cap per rank for --grid auto, e.g. 2G (default: none)")
    parser.add_argument("--space", choices=SPACE_CHOICES, default="auto", action=NoteGiven,
                        help="what --grid auto searches, exactly: grids, every weighted layer "
                             "in batch, model or domain mode on a Pr x Pc grid (the 1.5D "
                             "space); balanced, also a degree for several axes of each layer's "
                             "output at once (sample, channels, depth, height, width) where "
                             "every cut is even and the spatial degrees are within a factor of "
                             "2, and splits of a layer's input channels or features, summed in "
                             "the layer (seconds at 4096 ranks); axes, every split of every "
                             "axis, replicas and input channels (small nets on tens of ranks); "
                             "auto, balanced where it costs little: with compute from FLOPs, "
                             "or when timing the kernels it adds to the grids' is estimated at "
                             f"{AUTO_SECONDS:g} s or less, or {AUTO_SHARE * 100:g}%% of the run's "
                             "predicted time, else grids, "
                             "and the plan says which (default: auto); refused with a plan "
                             "given instead of --grid auto, which it would not change")
    parser.add_argument("--branches", choices=("auto", "serial"), default="auto",
                        help="how --grid auto may run the branches of a fork-join region (an "
                             "Inception module, a ResNet block with a convolution on its "
                             "shortcut): auto, on every rank one after another or side by side "
                             "on disjoint groups of ranks, whichever is predicted faster "
                             "(searched over the grids space; under a memory cap, kept when "
                             "the fastest plan with groups fits it); serial, "
                             "always on every rank (default: auto)")
    parser.add_argument("--retime", action="store_true",
                        help="time every kernel the plan needs afresh and replace what the "
                             "cache holds of them (the cache keeps each timing's conditions, "
                             "and times again by itself what was timed on a busy machine; "
                             "this is for what it cannot see, a node that changed)")
    parser.add_argument("--compute", choices=COMPUTE_SOURCES, default="auto",
                        help="compute times for the cost model: measured on this device, or "
                             "FLOPs / the profile's rate; auto measures on this machine's own "
                             "profile and uses FLOPs for another machine's (default: auto)")


class NoteGiven(argparse.Action):
    """Store the value and set ``<dest>_given`` too, so that a check (:func:`check_space`) can
    tell an option typed from one left out while the default stays what the code reads."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[object] | None, option_string: str | None = None
                 ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def check_space(args: argparse.Namespace, grids: Sequence[str | None], flag: str = "--grid"
                ) -> None:
    """Refuse what says how ``--grid auto`` searches (``--space`` given, ``--branches
    serial``) where nothing is searched, since it would be ignored: none of ``grids`` (the
    ``flag`` values; None where the flag was left out, pure batch) is auto, so each gives its
    plan."""
    searched = [name for name, told in (("space", getattr(args, "space_given", False)),
                                        ("branches", getattr(args, "branches", "auto")
                                         == "serial")) if told]
    if not searched or any(grid is not None and grid.strip() == "auto" for grid in grids):
        return
    given = [grid for grid in grids if grid is not None]
    what = (f"{flag} {shown(given[0])} gives the plan" if len(given) == 1
            else f"no {flag} is auto" if given else f"without {flag} the plan is pure batch")
    name = searched[0]
    raise UserError(f"--{name} {getattr(args, name)} is unused: it says what {flag} auto "
                    f"searches, and {what}; drop --{name} or give {flag} auto")


def add_run_options(parser: argparse.ArgumentParser, statistics: bool = True) -> None:
    """What every command that runs a network under a plan takes: the net, the grid, the
    device and how its arrays move, the seed and the threads per rank (and, unless told not
    to, batch norm's statistics groups: see :func:`add_net_options`)."""
    add_net_options(parser, statistics=statistics)
    parser.add_argument("--grid", default=None,
                        help="auto (the planner picks each layer's mode and grid), RxC (every "
                             "layer on R model x C batch ranks), conv=SPEC,fc=SPEC with SPEC = "
                             "RxC, domain:RxC or a degree per axis (n2h2w2; i2 or s2 splits "
                             "the input channels), or a plan file (default: 1xP, pure batch)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="NumPy on the CPU or CuPy on a GPU; each rank uses GPU "
                             "local_rank %% n_gpus (default: %(default)s)")
    add_collectives_option(parser)
    parser.add_argument("--seed", type=parse_seed, default=None,
                        help="seed of weights, data order, dropout: an integer in [0, 2**63) "
                             "(default: 0, or the checkpoint's when resuming)")
    add_threads_option(parser)


def add_collectives_option(parser: argparse.ArgumentParser) -> None:
    """--collectives: how arrays move between ranks on a GPU (:mod:`hpctrain.comm.transport`)."""
    parser.add_argument("--collectives", choices=("auto", "nccl", "mpi"), default="auto",
                        help="how the ranks' arrays move on a GPU: nccl (device memory, on the "
                             "compute stream), or mpi (through host memory, or device memory "
                             "with HPCTRAIN_CUDA_AWARE_MPI=1); auto: nccl where CuPy has NCCL, "
                             "unless ranks share a GPU, which NCCL refuses before 2.30.3 or "
                             "without NCCL_MULTI_RANK_GPU_ENABLE=1, else mpi; the CPU always "
                             "uses mpi (default: %(default)s)")


def add_precision_option(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--precision: storage, master weights and products (:mod:`hpctrain.device.precision`)."""
    from hpctrain.device.precision import RUN_PRECISIONS

    parser.add_argument("--precision", choices=RUN_PRECISIONS, default=default,
                        help="fp32: float32, strict products; tf32: float32 storage, products "
                             "on tensor cores (inputs rounded to 10 bits of mantissa); bf16 or "
                             "fp16: activations, weights and gradients (and their sums) in 16 "
                             "bits, float32 master weights and optimizer state, float32 sums "
                             "inside products, batch-norm statistics and the loss; fp16 with "
                             "dynamic loss scaling; fp64: float64 throughout. auto: tf32 on a "
                             "GPU (as PyTorch's cuDNN convolutions by default), fp32 on the "
                             "CPU. float32 and float64 are read as fp32 and fp64 "
                             "(default: %(default)s)")


def betas(text: str) -> tuple[float, float]:
    """``--betas``: two numbers in [0, 1), comma-separated."""
    try:
        found = tuple(float(word) for word in text.split(","))
    except ValueError:
        found = ()
    if len(found) != 2 or not all(0 <= b < 1 for b in found):
        raise argparse.ArgumentTypeError(f"'{text}' is not two numbers in [0, 1) such as "
                                         f"0.9,0.999")
    return found


def add_optimizer_options(parser: argparse.ArgumentParser) -> None:
    """--optimizer and its flags, --momentum, --weight-decay, --no-decay-norm-bias and
    --clip-grad-norm (see :mod:`hpctrain.run.optimizer`)."""
    group = parser.add_argument_group("optimizer")
    group.add_argument("--optimizer", choices=("sgd", "adamw", "lars", "lamb"), default="sgd",
                       help="sgd: momentum SGD (torch.optim.SGD); adamw: Adam with decoupled "
                            "weight decay (torch.optim.AdamW); lars: SGD whose step for each "
                            "tensor is scaled by the trust ratio eta*|w|/(|g| + wd*|w| + eps), "
                            "as the large-batch ResNet recipes; lamb: Adam's direction plus "
                            "wd*w, scaled by |w|/|direction| per tensor. The norms are of "
                            "whole tensors, exact under every plan (default: %(default)s)")
    group.add_argument("--momentum", type=float, default=None,
                       help="sgd and lars: the momentum (default: 0.9)")
    group.add_argument("--weight-decay", type=float, default=5e-4,
                       help="weight decay wd: L2 added to the gradient for sgd and lars, "
                            "decoupled for adamw, in the direction for lamb (default: 5e-4)")
    group.add_argument("--betas", type=betas, default=None, metavar="B1,B2",
                       help="adamw and lamb: the moments' decay rates (default: 0.9,0.999)")
    group.add_argument("--eps", type=float, default=None,
                       help="adamw, lamb and lars: the term that keeps a division finite "
                            "(default: 1e-8)")
    group.add_argument("--trust-coefficient", type=float, default=None, metavar="ETA",
                       help="lars: eta in its trust ratio (default: 0.001)")
    group.add_argument("--bias-correction", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="lamb: divide the moments by 1 - beta**t, as the paper's "
                            "algorithm (adamw always does) (default: on)")
    group.add_argument("--no-decay-norm-bias", action="store_true",
                       help="every optimizer: no weight decay for the parameters of one axis "
                            "(biases, batch and layer norm's scale and shift), and under lars "
                            "and lamb no trust ratio for them either, as large-batch recipes do")
    group.add_argument("--clip-grad-norm", type=float, default=None, metavar="C",
                       help="scale every gradient by min(1, C / (|g| + 1e-6)), |g| the norm "
                            "of all of them together (torch.nn.utils.clip_grad_norm_), after "
                            "fp16's unscaling; the norm goes into the log (default: no "
                            "clipping)")


def optimizer_choice(args: argparse.Namespace):
    """(momentum, :class:`~hpctrain.run.optimizer.OptimizerSettings`) the optimizer flags give;
    a flag given to an optimizer that has no use for it is refused, naming both."""
    from hpctrain.run.optimizer import OptimizerSettings

    name = args.optimizer
    uses = {"momentum": ("sgd", "lars"), "betas": ("adamw", "lamb"),
            "eps": ("adamw", "lamb", "lars"), "trust_coefficient": ("lars",),
            "bias_correction": ("lamb",)}
    for flag, takers in uses.items():
        if getattr(args, flag) is not None and name not in takers:
            spelled = "--" + flag.replace("_", "-")
            if flag == "bias_correction" and not args.bias_correction:
                spelled = "--no-bias-correction"
            raise UserError(f"{spelled} is for --optimizer {' or '.join(takers)}, not "
                            f"--optimizer {name}; drop it or choose one of those")
    defaults = OptimizerSettings()
    settings = OptimizerSettings(
        name, args.betas or defaults.betas, defaults.eps if args.eps is None else args.eps,
        defaults.trust if args.trust_coefficient is None else args.trust_coefficient,
        args.bias_correction is not False, not args.no_decay_norm_bias, args.clip_grad_norm)
    settings.check()
    return 0.9 if args.momentum is None else args.momentum, settings
