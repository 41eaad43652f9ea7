"""``python -m hpctrain simulate``: a study from the cost model, to HDF5.

The flags choose the study and its settings; the study itself lives in :mod:`hpctrain.study`:
by default the paper's Section 3, strong, weak and domain scaling with the planner's plan and two
baselines at every point (:mod:`hpctrain.study.paper`); ``--levels``, plans made with and without
the machine's levels (:mod:`hpctrain.study.levels`); ``--volumes``, a net on 3-D volumes under a
memory cap per rank (:mod:`hpctrain.study.volumes`); ``--ddp``, the auto plan against PyTorch
DDP's step (:mod:`hpctrain.study.ddp`); ``--side-by-side``, the auto plan with and without
regions on groups of ranks (:mod:`hpctrain.study.branches`). This module checks the flags,
refusing in one line before any work what a study does not take, runs the study, writes its
file, prints its summary and, with ``--plots``, draws the figures.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from hpctrain.cost.machine import Machine, load_machine
from hpctrain.device.precision import resolve_precision
from hpctrain.errors import ArgumentParser, OutputError, UserError, shown
from hpctrain.interchange.nets import load_network
from hpctrain.io.locations import checkout_root
from hpctrain.model.net import load_net
from hpctrain.study import branches, ddp, levels, paper, volumes
from hpctrain.study.records import planned_provenance

# the default --out of each study
STUDIES_OUT, LEVELS_OUT = "runs/simulation.h5", "runs/levels.h5"
VOLUMES_OUT, DDP_OUT = "runs/volumes.h5", "runs/ddp.h5"
SIDE_OUT = "runs/side_by_side.h5"


# -- command line -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from hpctrain.commands.flags import add_net_options, parse_size
    from hpctrain.commands.plan import add_planning_precision
    from hpctrain.plan.spaces import SPACE_CHOICES

    parser = ArgumentParser(
        prog="python -m hpctrain simulate",
        description="Predict communication and total time per epoch of a net for every Pr x Pc "
                    "grid under the paper's equations (Gholami et al., SPAA 2018, Sec. 3): "
                    "strong scaling (B = 2048, P = 8..512), weak scaling (B = 16 P) and domain "
                    "parallelism beyond P = B (B = 512, P = 512..4096), with the planner's "
                    "auto plan at every point. With --levels instead: plans made with and "
                    "without the machine's levels (inside a node, between nodes), priced on "
                    "the levelled machine, P = 8..4096. With --volumes instead: CosmoFlow "
                    "on 128^3 and 512^3 volumes, the auto plan under a memory cap per rank "
                    "against pure batch, P = 8..4096. Pure cost model: no MPI, runs in "
                    "seconds. Writes one HDF5 file; --plots also draws the figures.")
    add_net_options(parser, image_size=False)
    parser.add_argument("--machine", default="cori-knl",
                        help="machine profile by name or TOML path: alpha, beta and the FLOP "
                             "rate of one rank (default: %(default)s, the paper's Table 1); "
                             "--levels needs one with levels")
    parser.add_argument("--images", default="1200000",
                        help="images per epoch; an epoch is images/B iterations "
                             "(default: %(default)s, ImageNet)")
    add_planning_precision(parser, default="fp32")  # the paper's 4-byte word
    parser.add_argument("--strong-batch", default="2048",
                        help="global batch of the strong-scaling study, and the least batch "
                             "of the --levels study, B = max(this, P) (default: %(default)s)")
    parser.add_argument("--weak-batch-per-rank", default="16",
                        help="samples per rank in the weak-scaling study, B = this x P "
                             "(default: %(default)s)")
    parser.add_argument("--domain-batch", default="512",
                        help="global batch of the domain study, P = 512..4096, and of the "
                             "--levels points with P > B (default: %(default)s)")
    parser.add_argument("--overlap", action="store_true",
                        help="cost the implementation model's plans (auto and the baselines) "
                             "with gradient sums in flight, as a run with --overlap: the "
                             "machine profile's 'overlap' share of each sum hides behind the "
                             "backward below it (the paper's rows count every sum, as its "
                             "equations do; cori-knl's share is 0: nothing hides until a "
                             "profile says so)")
    parser.add_argument("--levels", action="store_true",
                        help="instead of the three studies, compare plans made without the "
                             "machine's levels (the network's link between every pair of "
                             "ranks) with plans made with them, both priced on the levelled "
                             "machine: per net (AlexNet, ResNet-50 and Inception-v3, or --net) "
                             "and P = 8..4096 at B = max(--strong-batch, P); needs --machine "
                             "with levels (ranks_per_node and [network])")
    sizes = " and ".join(f"{size}^3" for size in volumes.VOLUME_SIZES)
    procs = volumes.VOLUMES_PROCS
    parser.add_argument("--volumes", action="store_true",
                        help=f"instead of the three studies, the volumes study: "
                             f"{volumes.VOLUMES_NET} (or --net, a volume net) on {sizes} "
                             f"volumes, P = {procs[0]}..{procs[-1]}, strong scaling (B = "
                             f"--strong-batch, default {volumes.VOLUMES_STRONG_BATCH} here) and "
                             f"weak scaling (one volume per rank at 128^3, per 4 ranks at "
                             f"512^3), the auto plan under --mem-per-rank against pure batch "
                             f"where it runs and fits (default --machine "
                             f"{volumes.VOLUMES_MACHINE})")
    parser.add_argument("--ddp", action="store_true",
                        help="instead of the three studies, the auto plan against the "
                             "DDP-faithful step (pure batch, statistics per rank, 25 MiB "
                             "gradient buckets in flight with the profile's overlap), each "
                             "batch-norm choice (rank, global) priced alike: ResNet-50, "
                             "Inception-v3 and CosmoFlow (or --net) on dgx-h100 and "
                             "perlmutter-gpu (or --machine), P = 8..4096 at B = "
                             "max(--strong-batch, P)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="instead of the three studies, the auto plan with every branch on "
                             "every rank against the auto plan that may run a fork-join "
                             "region's branches side by side on groups of ranks, both "
                             "batch-norm choices (global, rank): Inception-v3 and ResNet-50 "
                             "(or --net) on dgx-h100 and perlmutter-gpu (or --machine), P = "
                             f"4..4096 at B = max(--strong-batch, P) (default "
                             f"{branches.SIDE_BATCH} here); and FlexFlow's case, Inception-v3 "
                             "on the 4 GPUs of one node against data parallelism")
    parser.add_argument("--mem-per-rank", type=parse_size, default=None,
                        help="--volumes only: the cap on the predicted peak memory per rank, "
                             "e.g. 40G (default: 40G, an A100 of perlmutter-gpu)")
    parser.add_argument("--space", choices=SPACE_CHOICES, default=volumes.VOLUMES_SPACE,
                        help="--volumes only: what its auto plan searches (hpctrain plan "
                             "--help; the other studies search the 1.5D grids, the paper's "
                             "space) (default: %(default)s, which with compute from the FLOP "
                             "rate is balanced)")
    parser.add_argument("--out", default=None,
                        help=f"HDF5 file to write, atomically (default: {STUDIES_OUT}; "
                             f"{LEVELS_OUT} with --levels; {VOLUMES_OUT} with --volumes; "
                             f"{DDP_OUT} with --ddp; {SIDE_OUT} with --side-by-side)")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="also draw the PNG figures into DIR "
                             "(analysis/plot_simulation.py of a source checkout; needs "
                             "matplotlib)")
    return parser


def _positive_int(text: str, flag: str) -> int:
    """``text`` as an integer ≥ 1, accepting 1_200_000 and 1.2e6 when they are whole."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise UserError(f"{flag} {shown(text)} is not a number; give a positive integer"
                        ) from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise UserError(f"{flag} {shown(text, quoted=False)} must be a positive integer")
    return int(value)


def _settings(args: argparse.Namespace) -> paper.Settings:
    machine = load_machine(args.machine)
    return paper.Settings(load_network(args.net, loss=args.loss), machine,
                          _positive_int(args.images, "--images"),
                          resolve_precision(args.precision, machine.device),
                          _positive_int(args.strong_batch, "--strong-batch"),
                          _positive_int(args.weak_batch_per_rank, "--weak-batch-per-rank"),
                          _positive_int(args.domain_batch, "--domain-batch"), args.overlap,
                          args.bn_group)


def plot_script() -> Path | None:
    """analysis/plot_simulation.py of the source checkout hpctrain runs from; None when it runs
    from an installed wheel, which ships no analysis/."""
    root = checkout_root()
    script = None if root is None else root / "analysis" / "plot_simulation.py"
    return script if script is not None and script.is_file() else None


def _plotting_script() -> Path:
    """The script ``--plots`` runs, refused in one line before any work when it cannot: an
    installed hpctrain has no analysis/, and the script needs matplotlib."""
    import importlib.util

    script = plot_script()
    if script is None:
        raise UserError("--plots needs analysis/plot_simulation.py of a source checkout (an "
                        "installed hpctrain has no analysis/); simulate without --plots, then "
                        "run 'python analysis/plot_simulation.py FILE.h5 --out DIR' in one")
    if importlib.util.find_spec("matplotlib") is None:
        raise UserError("--plots needs matplotlib: pip install 'hpctrain[plots]'")
    return script


def _draw(script: Path, h5: Path, out_dir: str) -> None:
    """Run ``script`` (analysis/plot_simulation.py, a program of its own that reads the HDF5
    file only) on ``h5`` with this Python; it prints each figure it writes."""
    import subprocess

    sys.stdout.flush()
    result = subprocess.run([sys.executable, str(script), str(h5), "--out", out_dir],
                            check=False)
    if result.returncode != 0:
        raise OutputError(f"--plots {out_dir}: {script.name} failed with status "
                          f"{result.returncode} (its message is above); {h5} is written")


def _overlap_line(machine: Machine) -> str:
    if not machine.overlap:
        return (f"--overlap: machine {machine.name} has overlap share 0, so no gradient sum "
                f"hides; give --machine a profile with 'overlap' (calibrate measures it)")
    return (f"--overlap: {machine.overlap:.2f} of each gradient sum may hide behind the "
            f"backward (machine {machine.name}); implementation times count the rest")


# the options given on the line, told from their defaults (see _parse)
_TOLD = ("net", "out", "images", "weak_batch_per_rank", "domain_batch", "overlap", "machine",
         "strong_batch", "mem_per_rank", "bn_group", "space", "loss")
_NOT_FOR_LEVELS = {"images": "--images", "weak_batch_per_rank": "--weak-batch-per-rank",
                   "overlap": "--overlap", "bn_group": "--bn-group"}
_NOT_FOR_VOLUMES = {"images": "--images", "weak_batch_per_rank": "--weak-batch-per-rank",
                    "domain_batch": "--domain-batch", "overlap": "--overlap",
                    "bn_group": "--bn-group"}


def _parse(argv: list[str]) -> tuple[argparse.Namespace, set[str]]:
    """The options of ``argv``, and which of ``_TOLD`` the line gave: --levels plans three
    nets unless --net names one, and refuses the other studies' options."""
    parser = build_parser()
    unset = object()
    args = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(_TOLD, unset)))
    given = {dest for dest in _TOLD if getattr(args, dest) is not unset}
    for dest in _TOLD:
        if dest not in given:
            setattr(args, dest, parser.get_default(dest))
    several = args.levels or args.volumes or args.ddp or args.side_by_side
    if "loss" in given and "net" not in given and several:
        raise UserError(f"--loss {args.loss} is the loss of the net --net names, and this study "
                        f"plans its own shipped nets; give --net too, or drop --loss")
    if args.out is None:
        args.out = (LEVELS_OUT if args.levels else VOLUMES_OUT if args.volumes
                    else DDP_OUT if args.ddp else SIDE_OUT if args.side_by_side
                    else STUDIES_OUT)
    return args, given


def _refuse_given(given: set[str], options: dict[str, str], why: str) -> None:
    """Refuse in one line (``why``, naming the ``{flag}``) the first of ``options`` (dest →
    flag) the line gave."""
    for dest, flag in options.items():
        if dest in given:
            raise UserError(why.format(flag=flag))


def _run_levels(args: argparse.Namespace, given: set[str], argv: list[str]) -> int:
    """The --levels study: refuse what it cannot do in one line, before any work; then plan,
    write, summarise (and draw with --plots)."""
    _refuse_given(given, _NOT_FOR_LEVELS, "{flag} belongs to the strong, weak and domain "
                  "studies; --levels takes --net, --machine, --strong-batch, --domain-batch, "
                  "--precision, --out and --plots")
    machine = load_machine(args.machine)
    if not machine.levelled:
        names = levels.levelled_profiles()
        fix = (f"give --machine {names[0]}" if names else
               "give --machine a profile with ranks_per_node and a [network] table")
        raise UserError(f"--levels needs a machine profile with levels "
                        f"({', '.join([*names, '…'])}); {machine.name} is flat: {fix}")
    nets = ([load_network(args.net, loss=args.loss)] if "net" in given
            else [load_net(n) for n in levels.LEVELS_NETS])
    least_batch = _positive_int(args.strong_batch, "--strong-batch")
    domain_batch = _positive_int(args.domain_batch, "--domain-batch")
    precision = resolve_precision(args.precision, machine.device)
    out, script = _outputs(args, "levels.h5")
    study = levels.run_levels(nets, machine, least_batch, levels.LEVELS_PROCS, precision,
                              domain_batch, paper.DOMAIN_PROCS)
    levels.write_levels_hdf5(out, study, levels.levels_attrs(study, precision, argv))
    return _report(out, [levels.levels_summary(study)], script, args.plots)


def _run_volumes(args: argparse.Namespace, given: set[str], argv: list[str]) -> int:
    """The --volumes study: refuse what it cannot do in one line, before any work; then plan,
    write, summarise (and draw with --plots)."""
    if args.levels:
        raise UserError("--volumes and --levels are two studies; give one of them")
    _refuse_given(given, _NOT_FOR_VOLUMES, "{flag} belongs to the strong, weak and domain "
                  "studies; --volumes takes --net, --machine, --mem-per-rank, --strong-batch, "
                  "--space, --precision, --out and --plots")
    net = (load_network(args.net, loss=args.loss) if "net" in given
           else load_net(volumes.VOLUMES_NET))
    if len(net.input_shape) != 4:
        raise UserError(f"--volumes needs a net on volumes (input size=DxHxW), such as "
                        f"{volumes.VOLUMES_NET}; {net.name} takes input of shape "
                        f"{net.input_shape}")
    machine = load_machine(args.machine if "machine" in given else volumes.VOLUMES_MACHINE)
    cap = args.mem_per_rank if "mem_per_rank" in given else volumes.VOLUMES_CAP
    strong_batch = (_positive_int(args.strong_batch, "--strong-batch")
                    if "strong_batch" in given else volumes.VOLUMES_STRONG_BATCH)
    precision = resolve_precision(args.precision, machine.device)
    out, script = _outputs(args, "volumes.h5")
    study = volumes.run_volumes(net, machine, volumes.VOLUME_SIZES, volumes.VOLUMES_PROCS,
                                strong_batch, cap, precision, args.space)
    volumes.write_volumes_hdf5(out, study, volumes.volumes_attrs(study, precision, argv))
    return _report(out, [volumes.volumes_summary(study)], script, args.plots)


_NOT_FOR_DDP = {"images": "--images", "weak_batch_per_rank": "--weak-batch-per-rank",
                "domain_batch": "--domain-batch", "overlap": "--overlap",
                "mem_per_rank": "--mem-per-rank", "bn_group": "--bn-group"}


def _run_ddp(args: argparse.Namespace, given: set[str], argv: list[str]) -> int:
    """The --ddp study: refuse what it cannot do in one line, before any work; then price,
    write and summarise."""
    if args.levels or args.volumes:
        raise UserError("--ddp, --levels and --volumes are three studies; give one of them")
    _refuse_given(given, _NOT_FOR_DDP, "{flag} does not apply to --ddp, which prices both "
                  "batch-norm choices with sums in flight; it takes --net, --machine, "
                  "--strong-batch, --precision and --out")
    nets = ([load_network(args.net, loss=args.loss)] if "net" in given
            else [load_net(n) for n in ddp.DDP_NETS])
    machines = ([load_machine(args.machine)] if "machine" in given
                else [load_machine(name) for name in ddp.DDP_MACHINES])
    if args.plots is not None:
        raise UserError("--plots draws the other studies' figures; --ddp prints its table")
    out, _ = _outputs(args, "ddp.h5")
    study = ddp.run_ddp_study(nets, machines, _positive_int(args.strong_batch, "--strong-batch"),
                          precision=args.precision)
    ddp.write_ddp_hdf5(out, study, {"precision": study.precision,
                                    "least_batch": study.least_batch,
                                    **planned_provenance(argv, "see ddp.description")})
    return _report(out, [ddp.ddp_summary(study)], None, None)


def _run_side_by_side(args: argparse.Namespace, given: set[str], argv: list[str]) -> int:
    """The --side-by-side study: refuse what it cannot do in one line, before any work; then
    plan, write and summarise."""
    if args.levels or args.volumes or args.ddp:
        raise UserError("--side-by-side, --ddp, --levels and --volumes are four studies; give "
                        "one of them")
    _refuse_given(given, _NOT_FOR_DDP, "{flag} does not apply to --side-by-side, which plans "
                  "both batch-norm choices with sums in flight; it takes --net, --machine, "
                  "--strong-batch, --precision and --out")
    if args.plots is not None:
        raise UserError("--plots draws the other studies' figures; --side-by-side prints its "
                        "table")
    nets = ([load_network(args.net, loss=args.loss)] if "net" in given
            else [load_net(n) for n in branches.SIDE_NETS])
    machines = ([load_machine(args.machine)] if "machine" in given
                else [load_machine(name) for name in branches.SIDE_MACHINES])
    least = (_positive_int(args.strong_batch, "--strong-batch") if "strong_batch" in given
             else branches.SIDE_BATCH)
    out, _ = _outputs(args, "side_by_side.h5")
    study = branches.run_side_study(nets, machines, least, precision=args.precision)
    branches.write_side_hdf5(out, study, {
        "precision": study.precision, "least_batch": study.least_batch,
        **planned_provenance(argv, "see side_by_side.description")})
    return _report(out, [branches.side_summary(study)], None, None)


def _outputs(args: argparse.Namespace, example: str) -> tuple[Path, Path | None]:
    """The HDF5 file to write and the plotting script (when --plots), checked before any
    work."""
    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give a file path such as {out}/{example}")
    return out, _plotting_script() if args.plots is not None else None


def _report(out: Path, lines: list[str], script: Path | None, plots: str | None) -> int:
    """Print the summary ``lines`` and where the file went, then draw the plots."""
    print("\n".join([*lines, f"wrote {out}"]), flush=True)
    if script is not None:
        _draw(script, out, plots)
    return 0


def run(argv: list[str]) -> int:
    """Run the three studies (the --levels study with ``--levels``, the --volumes study with
    ``--volumes``), write the HDF5 file (and the plots with ``--plots``); 0 on success. Bad
    options raise :class:`~hpctrain.errors.UserError`."""
    args, given = _parse(argv)
    if "space" in given and not args.volumes:
        raise UserError("--space belongs to the --volumes study; the other studies search the "
                        "1.5D grids, the space of the paper they reproduce")
    if args.side_by_side:
        return _run_side_by_side(args, given, argv)
    if args.ddp:
        return _run_ddp(args, given, argv)
    if args.volumes:
        return _run_volumes(args, given, argv)
    if "mem_per_rank" in given:
        raise UserError("--mem-per-rank belongs to the --volumes study; the other studies "
                        "plan without a memory cap")
    if args.levels:
        return _run_levels(args, given, argv)
    settings = _settings(args)
    out, script = _outputs(args, "sim.h5")
    studies = paper.run_studies(settings)
    paper.write_hdf5(out, studies, paper.root_attrs(settings, argv))
    overlap = [_overlap_line(settings.machine)] if settings.overlap else []
    return _report(out, [*overlap, paper.summary(studies)], script, args.plots)
