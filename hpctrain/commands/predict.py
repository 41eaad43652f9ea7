"""``python -m hpctrain predict``: a net's outputs for every sample of a dataset or an array,
under any plan, on P ranks::

    mpiexec -n P python -m hpctrain predict --checkpoint ckpt/ --data d.h5 --out preds.h5
    mpiexec -n P python -m hpctrain predict --net model.onnx --data x.npy --out preds.h5 \\
        --grid auto

The forward pass alone: batch norm normalises by its running statistics, dropout is off.
``--grid auto`` plans the forward pass alone (:class:`~hpctrain.plan.pricing.CostModel`'s
``inference``: no gradient or optimizer state, nothing kept for a backward), so a domain plan
lets a volume too large for one device's training be predicted at all. The weights are a
checkpoint's (its net too), an ONNX model's initializers, or ``--init``'s.

Rank 0 gathers each batch's outputs and writes them as they come into ``/outputs`` of the
``--out`` file, one row per sample in the data's order (float32); the file is written beside its
name and renamed when complete, and an existing file is replaced only when it is an hpctrain
predictions file. Where the data hold labels (or targets), the loss and accuracy over every
sample are printed and kept in the file's attributes. A segmentation net's outputs are its
scores per pixel, ``/outputs`` (N, K, H, W), with ``/label_maps`` (N, H, W) the class of largest
score at each pixel; against label maps the pixel accuracy and the mean IoU are printed and
kept too. A line of progress is printed every
``--print-every`` seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.commands.flags import (
    add_init_options,
    add_planning_options,
    add_precision_option,
    add_run_options,
    check_space,
    positive_int,
    with_init,
)
from hpctrain.errors import ArgumentParser, OutputError, UserError, shown_path
from hpctrain.kernels.segmentation import PixelTotals, class_counts, pixel_cross_entropy
from hpctrain.model.net import NetSpec

FORMAT = "hpctrain-predictions"  #: the ``format`` attribute of a predictions file
SPLITS = ("val", "train")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain predict",
        description="Run a net forward over every sample of a dataset split (.h5) or an array "
                    "(.npy) on P ranks under a plan, batch norm from its running statistics "
                    "and dropout off, and write the outputs, one row per sample in the data's "
                    "order, to /outputs of --out; print the loss and accuracy where the data "
                    "have labels or targets. Launch with mpiexec -n P or srun.",
        epilog="Exit status: 0 written; 1 a crash on some rank; 2 bad input (one line naming "
               "it), before any work; 3 the output could not be written.")
    add_run_options(parser, statistics=False)
    parser.add_argument("--checkpoint", default=None, metavar="PATH",
                        help="the trained weights and buffers: a checkpoint file or a "
                             "--checkpoint-dir (its newest); the checkpoint holds its net, so "
                             "--net is then needed only for an older checkpoint")
    add_init_options(parser)
    parser.add_argument("--data", required=True,
                        help="an hpctrain dataset (.h5; its --split is read) or a .npy array "
                             "of samples (N, *sample) as the net takes them, unlabelled")
    parser.add_argument("--split", choices=SPLITS, default=None,
                        help="the split of a dataset to predict (default: val)")
    parser.add_argument("--out", required=True, metavar="FILE.h5",
                        help="the HDF5 file to write: /outputs (N, outputs) float32")
    parser.add_argument("--batch", type=positive_int, default=32,
                        help="samples per forward pass, over all ranks (default: 32)")
    add_precision_option(parser)
    parser.add_argument("--print-every", type=float, default=10.0, metavar="SECONDS",
                        help="a progress line every so many seconds; 0: none "
                             "(default: %(default)s)")
    planning = parser.add_argument_group("planning")
    add_planning_options(planning)
    planning.add_argument("--plan-file", default=None,
                          help="where --grid auto writes its plan (default: "
                               "runs/NET-pP-bB-predict.plan)")
    parser.set_defaults(net=None)  # the checkpoint's, or --net: one must say
    return parser


@dataclass
class Prepared:
    """What rank 0 reads and checks before anything collective."""

    net: NetSpec
    checkpoint: Path | None
    seed: int
    dataset: Any  # DatasetInfo, or None for a .npy array
    split: str | None
    samples: int


def _prepare(args: argparse.Namespace, procs: int) -> Prepared:
    from hpctrain.data.dataset_fit import check_label_maps
    from hpctrain.data.dataset_format import inspect_dataset
    from hpctrain.interchange.nets import load_network, net_for_dataset
    from hpctrain.io.files import check_directory, check_output
    from hpctrain.run.checkpoint_file import checkpoint_net, read_checkpoint_info, resolve_resume

    if not (math.isfinite(args.print_every) and args.print_every >= 0):
        raise UserError(f"--print-every {args.print_every:g} must be a number of seconds >= 0")
    checkpoint = seed = None
    if args.checkpoint is not None:
        if args.init is not None:
            raise UserError(f"--init {args.init} and --checkpoint {args.checkpoint} both give "
                            f"the weights; give one")
        if args.seed is not None:
            raise UserError(f"--seed {args.seed} draws weights, and --checkpoint "
                            f"{args.checkpoint} gives them all; drop --seed")
        checkpoint = resolve_resume(Path(args.checkpoint))
        if args.net is not None:  # an older checkpoint's net: its weights are the checkpoint's
            net = replace(load_network(args.net, args.image_size, args.loss), weights=None)
        else:
            if args.loss != "auto":
                raise UserError(f"--loss {args.loss}: the checkpoint's net says its loss; drop "
                                f"--loss")
            net = checkpoint_net(checkpoint)
            if args.image_size is not None:
                net = net.with_image_size(args.image_size)
        seed = read_checkpoint_info(checkpoint, net).seed
    elif args.net is None:
        raise UserError("predict needs the net and its weights: give --checkpoint PATH (a "
                        "trained run's), or --net (an ONNX model with its weights, or any net "
                        "with --init FILE)")
    else:
        net = load_network(args.net, args.image_size, args.loss)
    net = with_init(args, net)
    dataset, samples = None, 0
    if Path(args.data).suffix == ".npy":
        if args.split is not None:
            raise UserError(f"--split {args.split} reads a split of a dataset; --data "
                            f"{args.data} is an array, read whole")
        samples = _array_samples(args.data)
    else:
        dataset = inspect_dataset(args.data)
        split = args.split or "val"
        samples = dataset.val_size if split == "val" else dataset.train_size
        if not samples:
            raise UserError(f"--data {args.data} has no {split} split; give --split train")
        # predict reads in order: a split smaller than a batch is fine (its last is padded)
        net = net_for_dataset(net, dataset, args.image_size is None and checkpoint is None, 1)
        check_label_maps(dataset, net.per_pixel, net.name)
    net = net.with_statistics("global", procs)
    out = Path(args.out)
    check_directory(out.parent, "--out")
    inputs = [(flag, Path(v)) for flag, v in (("--data", args.data), ("--net", args.net),
                                              ("--checkpoint", checkpoint), ("--init", args.init))
              if v is not None and Path(v).is_file()]
    check_output(out, "--out", is_predictions, "an hpctrain predictions file", inputs)
    check_space(args, [args.grid])
    if args.grid and args.grid.strip() == "auto":
        from hpctrain.commands.setup import plan_file_path
        from hpctrain.device.precision import resolve_precision
        from hpctrain.plan.plans import is_plan_file

        plan_file = plan_file_path(args.plan_file, net, procs, args.batch,
                                   resolve_precision(args.precision, args.device).name, "predict")
        check_directory(plan_file.parent, "--plan-file")
        check_output(plan_file, "--plan-file", is_plan_file, "an hpctrain plan file", inputs)
    elif args.plan_file is not None:
        raise UserError(f"--plan-file {args.plan_file} is where --grid auto writes its plan; "
                        f"give --grid auto, or drop --plan-file")
    seed = seed if seed is not None else (args.seed or 0)
    return Prepared(net, checkpoint, seed, dataset, args.split or (None if dataset is None
                                                                   else "val"), samples)


def _array_samples(path: str) -> int:
    from hpctrain.data.dataset_format import DatasetError

    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DatasetError(f"--data {shown_path(path)} is not a readable .npy array "
                           f"({err})") from None
    if array.ndim < 2 or not len(array):
        raise DatasetError(f"--data {shown_path(path)} holds an array of shape "
                           f"{array.shape}; give (N, *sample) samples, N at least 1")
    return len(array)


def is_predictions(path: Path) -> bool:
    """Whether ``path`` is a predictions file hpctrain wrote (its ``format`` attribute says so)."""
    from hpctrain.io.files import is_hdf5_of

    return is_hdf5_of(path, FORMAT)


def run(argv: list[str], comm) -> int:
    from hpctrain.comm.agree import agreed
    from hpctrain.comm.grid import GridSet
    from hpctrain.commands.setup import SetupRequest, plan_file_path, set_up
    from hpctrain.device.precision import resolve_precision
    from hpctrain.plan.planner import format_plan
    from hpctrain.run.network import Network

    args = build_parser().parse_args(argv)
    rank, procs = comm.Get_rank(), comm.Get_size()
    prepared = agreed(comm, lambda: _prepare(args, procs))
    net = prepared.net
    plan_file = plan_file_path(args.plan_file, net, procs, args.batch,
                               resolve_precision(args.precision, args.device).name, "predict")
    request = SetupRequest(args.grid, args.batch, args.device, args.precision, args.threads,
                           args.machine, args.compute, args.mem_per_rank, "off", str(plan_file),
                           args.space, args.collectives, args.branches, inference=True,
                           retime=args.retime)
    setup = set_up(request, net, comm)
    if rank == 0:
        print(f"threads: {setup.threads.describe()}", flush=True)
        print(format_plan(setup.planned), flush=True)
        for line in setup.warnings:
            print(line, flush=True)
    with GridSet(comm) as grids:
        network = Network(setup.net, setup.plan, args.batch, grids, setup.backend,
                          prepared.seed)
        if prepared.checkpoint is not None:
            from hpctrain.run.checkpoint import load_checkpoint

            load_checkpoint(prepared.checkpoint, network, None)
        network.set_training(False)
        source, reader = _source(args, prepared, network, comm)
        try:
            _predict(args, prepared, network, source, comm)
        finally:
            if reader is not None:
                reader.close()
    return 0


def _source(args: argparse.Namespace, prepared: Prepared, network: Any, comm: Any
            ) -> tuple[Any, Any]:
    """The data in order, the last batch padded, each rank reading its own block; and the
    dataset reader under it, to close at the end (None for an array)."""
    from hpctrain.comm.agree import agreed

    net, backend = network.net, network.backend
    if prepared.dataset is None:
        from hpctrain.data.array_source import ArrayData

        return agreed(comm, lambda: ArrayData(backend, args.data, args.batch, net.input_shape,
                                              net.classes if net.regression else 0),
                      everywhere=True), None
    from hpctrain.data.augment import augment, window_size
    from hpctrain.data.dataset_fit import feeds_flat
    from hpctrain.data.dataset_reader import H5Data

    flatten = feeds_flat(prepared.dataset.sample_shape, net.input_shape)
    reader = agreed(comm, lambda: H5Data(backend, args.data, args.batch, prepared.seed,
                                         prepared.split, prepared.dataset, flatten,
                                         in_order=True), everywhere=True)
    # a net smaller than the images reads their centres, as held-out evaluation does
    return augment(reader, "none", prepared.seed, size=window_size(net.input_shape)), reader


def _gather(network: Any, comm: Any) -> Any:
    """Each batch's outputs, whole on rank 0: in each batch group the rank that owns the
    samples' loss (model coordinate 0) sends their rows, one copy of each."""
    from hpctrain.comm.gather import RowsToRoot
    from hpctrain.layout.layout import grid_coords

    layout = network.loss_layout
    if network.net.per_pixel:
        return _gather_pixels(network, comm)

    def rows_of(rank: int) -> tuple[int, int]:
        owns = layout.holds(rank) and grid_coords(rank, layout.grid)[0] == 0
        return layout.box(rank)[0] if owns else (0, 0)

    return RowsToRoot(comm, rows_of(comm.Get_rank()), rows_of, layout.shape[1],
                      layout.shape[0])


def _gather_pixels(network: Any, comm: Any) -> Any:
    """A segmentation's scores of each batch, (B, K, *S), whole on rank 0: copy 0 of each
    block of pixels sends it (a domain split's rows stay cut up to here), the others
    nothing."""
    from hpctrain.comm.gather import gather_to_root

    layout = network.loss_layout
    empty = tuple((0, 0) for _ in layout.shape)

    def box_of(rank: int) -> tuple:
        return layout.box(rank) if layout.replica_index(rank) == 0 else empty

    def gather(block: np.ndarray) -> np.ndarray | None:
        mine = block if network.owns_loss else block[tuple(slice(0, 0) for _ in block.shape)]
        return gather_to_root(network.backend, comm, mine, layout.shape, box_of, "copy",
                              dtype=np.float32)

    return gather


def _predict(args: argparse.Namespace, prepared: Prepared, network: Any, source: Any,
             comm: Any) -> None:
    """The forward passes, rank 0 writing as they come into a temporary it renames at the end.

    Every rank learns twice whether rank 0 can write: once its file is open (before the first
    forward, so that a rank 0 that cannot create it stops every rank there), and once it is
    renamed into place (a write that fails on the way leaves the passes to finish, then every
    rank raises the same error, and the file is never left half written)."""
    from mpi4py import MPI

    from hpctrain.io.files import replace_atomically

    rank, net, backend = comm.Get_rank(), network.net, network.backend
    batch, samples = args.batch, prepared.samples
    batches = math.ceil(samples / batch)
    gather = _gather(network, comm)
    what = (f"--data {args.data}" + (f" split {prepared.split}" if prepared.split else ""))
    if rank == 0:
        weights = (f"checkpoint {prepared.checkpoint}" if prepared.checkpoint is not None
                   else f"{net.weights.path}" if net.weights is not None
                   else f"drawn from seed {prepared.seed} (no --checkpoint, --init or ONNX "
                        f"model gave any)")
        print(f"predict: {net.name}, {samples} samples of {what}, batch {batch}, "
              f"{comm.Get_size()} processes, {backend.device} {backend.precision.name}; "
              f"weights: {weights}", flush=True)

    pixels = PixelTotals(net.classes)  # a segmentation's sums over every counted pixel
    every_pixel = ((0, batch), *((0, n) for n in net.out_shapes[-1][1:]))

    def passes(sink: Any) -> dict[str, Any]:
        totals = np.zeros(3)  # loss sum, correct, real samples
        failure, start = None, time.perf_counter()
        shown_at = start
        for b in range(batches):
            x = source.images(b, network.input_box)
            logits = network.forward(x, step=0)
            bad = comm.allreduce(1 if source.nonfinite else 0, op=MPI.SUM)
            network.refuse_nonfinite(bad, source)
            whole = gather(backend.to_numpy(logits))
            if whole is None:
                continue
            first = b * batch
            real_rows = min(batch, samples - first)
            if net.per_pixel:
                labels = backend.to_numpy(source.labels(b, every_pixel))
                loss_sum, weight_sum, correct, counted, _ = pixel_cross_entropy(
                    np, whole.astype(np.float64), labels, net.loss.weights,
                    net.loss.smoothing)
                both, union = class_counts(np, whole, labels)
                pixels.add(PixelTotals(net.classes, float(loss_sum), float(weight_sum),
                                       int(correct), int(counted), both, union))
                totals += (float(loss_sum), float(correct), float(counted))
                real = np.zeros(0, bool)
            else:
                labels = backend.to_numpy(source.labels(b, (0, batch)))
                real = net.loss.real(np, labels)
            if bool(real.any()):
                loss, correct, _ = net.loss.function(np, whole[real], labels[real], 1.0)
                totals += (float(loss), float(correct), float(real.sum()))
            if failure is None:
                try:
                    sink(first, whole[:real_rows])
                except OSError as err:  # the disk filled: finish the passes, then say so
                    failure = str(err)
            now = time.perf_counter()
            if args.print_every and now - shown_at >= args.print_every and b + 1 < batches:
                done = first + real_rows
                print(f"batch {b + 1}/{batches}: {done}/{samples} samples "
                      f"({done / samples:.0%}), {done / (now - start):.1f} samples/s",
                      flush=True)
                shown_at = now
        found = {"failure": failure, "seconds": time.perf_counter() - start,
                 "loss_sum": totals[0], "correct": totals[1], "counted": totals[2]}
        if net.per_pixel and pixels.counted:  # the weighted mean, and the mean IoU
            found.update(loss_sum=pixels.loss * pixels.counted, mean_iou=pixels.mean_iou)
        return found

    if rank != 0:
        _raise_failure(comm.bcast(None, root=0))  # rank 0 could open its file, or not
        passes(None)
        _raise_failure(comm.bcast(None, root=0))  # and wrote it, or not
        return
    result: dict[str, Any] = {}
    started = False

    def write(tmp: Path) -> None:
        nonlocal started
        import h5py

        with h5py.File(tmp, "w", locking=False) as h5:
            out_shape = net.out_shapes[-1]  # (K,), or (K, *S) per pixel
            outputs = h5.create_dataset("outputs", (samples, *out_shape), np.float32,
                                        chunks=(min(samples, batch), *out_shape))
            maps = (h5.create_dataset("label_maps", (samples, *out_shape[1:]), np.int64,
                                      chunks=(min(samples, batch), *out_shape[1:]))
                    if net.per_pixel else None)
            comm.bcast(None, root=0)  # open: every rank starts the passes
            started = True

            def sink(first: int, rows: np.ndarray) -> None:
                outputs[first:first + len(rows)] = rows
                if maps is not None:  # the class of largest score at each pixel
                    maps[first:first + len(rows)] = rows.argmax(axis=1)

            result.update(passes(sink))
            if result["failure"] is not None:
                raise OSError(result["failure"])  # no rename: the temporary goes
            h5.attrs.update(_attributes(args, prepared, network, result))

    failure = None
    try:
        replace_atomically(Path(args.out), write, ours=is_predictions)
    except (OutputError, OSError) as err:
        failure = str(err)
    if not started:  # the others wait before their first forward
        comm.bcast(failure or "the output could not be opened", root=0)
    else:
        comm.bcast(failure, root=0)
    _raise_failure(failure)
    _summary(Path(args.out), samples, net, result)


def _raise_failure(failure: str | None) -> None:
    """Raise rank 0's write failure, if any, on this rank."""
    if failure is not None:
        raise OutputError(f"could not write the predictions ({failure}); check that the "
                          f"directory is writable and has space")


def _attributes(args: argparse.Namespace, prepared: Prepared, network: Any,
                result: dict[str, Any]) -> dict[str, Any]:
    from hpctrain.plan.plans import plan_text

    net = network.net
    attrs = {"format": FORMAT, "version": 1, "net": net.name,
             "command": json.dumps(["python", "-m", "hpctrain", "predict", *sys.argv[2:]]),
             "data": str(args.data), "split": prepared.split or "", "samples": prepared.samples,
             "batch": args.batch, "processes": network.grids.world.Get_size(),
             "precision": network.backend.precision.name,
             "plan": plan_text(net, network.plan) + "\n", "seconds": result["seconds"],
             "outputs": ("targets" if net.regression else
                         "logits per pixel" if net.per_pixel else "logits")}
    if prepared.checkpoint is not None:
        attrs["checkpoint"] = str(prepared.checkpoint)
    if result["counted"]:
        attrs["loss"] = result["loss_sum"] / result["counted"]
        if net.loss.classifies:
            attrs["accuracy"] = result["correct"] / result["counted"]
        if "mean_iou" in result:
            attrs["mean_iou"] = result["mean_iou"]
    return attrs


def _summary(out: Path, samples: int, net: NetSpec, result: dict[str, Any]) -> None:
    rate = samples / result["seconds"] if result["seconds"] > 0 else float("inf")
    line = f"predicted {samples} samples in {result['seconds']:.2f} s ({rate:.1f} samples/s)"
    if result["counted"]:
        loss = result["loss_sum"] / result["counted"]
        what = "mean squared error" if net.regression else "loss"
        line += f": {what} {loss:.6g}"
        if net.per_pixel:
            line += (f", pixel accuracy {result['correct'] / result['counted']:.2%}, mean IoU "
                     f"{result['mean_iou']:.4f} over {int(result['counted'])} labelled pixels")
        elif net.loss.classifies:
            line += f", accuracy {result['correct'] / result['counted']:.2%}"
        if not net.per_pixel:
            line += f" over {int(result['counted'])} labelled samples"
    print(line, flush=True)
    print(f"outputs written to {out} (/outputs{', /label_maps' if net.per_pixel else ''})",
          flush=True)
