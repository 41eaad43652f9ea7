"""HDF5 checkpoints that hold every tensor whole, so a run can resume under any plan and any P.

A checkpoint is written by rank 0 alone, from one replica of each parameter gathered tensor by
tensor, and read by every rank, each reading only its own block. Nothing in the file depends on
the plan that wrote it: save on 4 ranks with conv=domain:2x2, resume on 6 ranks with 3x2, or on
one process. Layout (plain HDF5; ``h5py.File(path)["params/conv1.weight"][...]`` reads a tensor)::

    /params/<name>     the parameter <name> (e.g. conv1.weight, fc1.bias), whole, master dtype
    /momentum/<name>   SGD's or LARS's velocity of <name>, whole, master dtype; zeros when the
                       optimizer has not stepped yet (the first step then computes μ·0 + g,
                       exactly g)
    /exp_avg/<name>, /exp_avg_sq/<name>   AdamW's or LAMB's two moments of <name> instead
                       (PyTorch's names), whole, master dtype; zeros before the first step,
                       where they start
    /buffers/<name>    state kept but not trained (e.g. bn1.running_mean), whole, master
                       dtype; only for nets that have some
    /                  attrs:
        format   "hpctrain-checkpoint"         version  1
        net      the net's name                layers   the net's layers, one "NAME KIND" each
                                               (and " in=A,B" where it reads other layers
                                               than the line before): what a resume
                                               compares, with the tensors' shapes
        net_text the net as a flat .net text (:mod:`hpctrain.model.net_text`): what export and
                 predict rebuild it from, with no net file (absent before this was kept)
        step     steps completed: training resumes at batch ``step``
        seed     the run's seed                dtype    the master dtype ("float32"/"float64")
        precision  the run's --precision (fp32, tf32, bf16, fp16, fp64): informational; the
                 master weights are float32 under bf16 and fp16, so a run resumes under any
                 precision
        plan     the plan that wrote it, in plan-file format (informational: any plan may load it)
        state    JSON of the caller's extra state (config, schedule, ...): plain values only
        optimizer        the --optimizer whose state it holds ("sgd" where absent: older files)
        optimizer_steps  the updates it made (an fp16 run skips some; AdamW's and LAMB's bias
                 correction counts them); as many as ``step`` where absent

The random state is (seed, step). Initial weights, dropout masks and synthetic data come from a
counter-based generator keyed by the seed and indexed by the step and the global entry, so a run
rebuilt with the same seed and resumed at batch ``step`` draws exactly the masks and data the
uninterrupted run would have drawn; there is no generator state to save.

The file's format, and reading it in one process without MPI (``export``), is
:mod:`hpctrain.run.checkpoint_file`; this module saves and loads a running network.

Checkpoints of one run live in a directory as ``step-00000120.h5``
(:func:`~hpctrain.run.checkpoint_file.checkpoint_path`).
Files are written beside their final name under a temporary name starting with "." and renamed
when complete (:func:`hpctrain.io.files.replace_atomically`), so a crash leaves the previous
checkpoint or the new one, never half of one, and every ``step-*.h5`` file is complete. The
temporaries a crash leaves (``.step-*.h5.*.tmp``) are removed at the next start and whenever
checkpoints are pruned (:func:`~hpctrain.run.checkpoint_file.remove_temporaries`). Only
regular files count: a link named like a checkpoint is never read, replaced or deleted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.errors import OutputError, UserError
from hpctrain.io.files import replace_atomically
from hpctrain.layers.base import Parameter
from hpctrain.layout.layout import Box
from hpctrain.model.net import NetSpec
from hpctrain.model.net_text import net_text
from hpctrain.plan.plans import plan_text
from hpctrain.run.checkpoint_file import (  # noqa: F401 - the file's API, kept here too
    FORMAT,
    GROUPS,
    VERSION,
    CheckpointError,
    CheckpointInfo,
    checkpoint_path,
    finite_block,
    is_checkpoint,
    latest_checkpoint,
    open_checkpoint,
    prune_checkpoints,
    read_checkpoint_info,
    remove_temporaries,
    resolve_resume,
    step_of,
    tensor_shapes,
    validated_header,
)
from hpctrain.run.network import Network
from hpctrain.run.optimizer import Optimizer

# --- writing ---------------------------------------------------------------------------------


def save_checkpoint(path: Path, network: Network, optimizer: Optimizer, step: int,
                    state: dict[str, Any], comm: MPI.Comm, *, seed: int) -> None:
    """Write ``network``'s parameters and ``optimizer``'s state to ``path``. Collective.

    Parameters
    ----------
    path : the file to (re)place; its directory is created.
    network, optimizer : the model and its optimizer, on the ranks of ``comm`` (the network's
        world).
    step : steps completed; a resumed run starts at batch ``step``.
    state : extra plain values (config, schedule, ...) stored as JSON; rank 0's is written.
    comm : the network's world communicator.
    seed : the seed the network and data were built with (the network does not keep it).

    Rank 0 receives one replica of each tensor at a time (never a replica per rank) and writes
    it before the next, so its extra memory is that of the largest tensor: the gather's receive
    buffer and assembled tensor in float64, then the cast to the training dtype, whatever P.

    If writing fails (disk full, no permission: an ``OSError``; or ``path`` is something
    hpctrain did not write) rank 0 still takes part in every remaining gather and then
    broadcasts the failure, so every rank raises the same :class:`OutputError` and none is
    left waiting; the previous file at ``path``, if any, is unchanged and no temporary file
    remains.
    """
    path = Path(path)
    rank = comm.Get_rank()
    network.settle_buffers()  # running statistics over groups: every rank the same
    tensors = _gathered_tensors(network, optimizer, comm)  # one collective per item
    failure = None
    if rank == 0:
        try:
            header = _header(network, step, state, seed)
            header |= {"optimizer": optimizer.name, "optimizer_steps": optimizer.steps}
            replace_atomically(path, lambda tmp: _write(tmp, header, tensors),
                               ours=is_checkpoint)
        except OutputError as err:  # disk full, no permission, or not ours to replace: finish
            failure = str(err)      # the gathers, then report it
    for _ in tensors:  # the other ranks' share, or what rank 0 left when writing failed
        pass
    failure = comm.bcast(failure, root=0)
    if failure is not None:
        raise OutputError(f"could not write checkpoint {path} ({failure}); check that the "
                          f"directory is writable and has space (any older file is intact)")


def _header(network: Network, step: int, state: dict[str, Any], seed: int) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "net": network.net.name,
            "net_text": net_text(network.net),
            "layers": network.net.architecture(), "step": int(step), "seed": int(seed),
            "plan": plan_text(network.net, network.plan) + "\n",
            "dtype": np.dtype(network.backend.precision.master).name,
            "precision": network.backend.precision.name, "state": json.dumps(state)}


def _gathered_tensors(network: Network, optimizer: Optimizer, comm: MPI.Comm
                      ) -> Iterator[tuple[str, np.ndarray | None]]:
    """("params/NAME" or "STATE/NAME", the whole tensor on rank 0, None elsewhere), in turn.

    Each item costs one ``Gatherv`` over ``comm``; only the first rank holding each block sends
    it (the others send nothing), so rank 0 receives exactly one copy of the tensor.
    """
    backend, rank = network.backend, comm.Get_rank()
    master = backend.precision.master  # the weights at full precision, whatever the kernels use
    nothing = backend.xp.empty(0, master)

    def gathered(tensor: Parameter, locals_: dict[str, Any]
                 ) -> Iterator[tuple[str, np.ndarray | None]]:
        box_of = _one_replica(tensor, comm.Get_size())
        sends = box_of(rank) == tensor.box(rank)
        for group, local in locals_.items():
            whole = gather_to_root(backend, comm, local if sends else nothing, tensor.shape,
                                   box_of, "copy", dtype=master)  # no float64 detour
            yield f"{group}/{tensor.name}", whole

    for k, param in enumerate(network.params):
        tensors = {"params": param.weights}
        for name, values in optimizer.state.items():
            # not stepped yet: zeros, where the moments start, and μ·0 + g == g for a velocity
            tensors[name] = (backend.xp.zeros_like(param.weights) if values[k] is None
                             else values[k])
        yield from gathered(param, tensors)
    for buffer in network.buffers:
        yield from gathered(buffer, {"buffers": buffer.value})


def _one_replica(param: Parameter, size: int) -> Callable[[int], Box]:
    """``box_of`` for the gather: each block from its lowest rank, an empty box for replicas.

    E.g. a weight split over Pr = 2 on a 2×3 grid: ranks 0 and 1 hold the two halves and send
    them; ranks 2..5 (batch index j > 0) hold the same halves again and send nothing.
    """
    empty = tuple((0, 0) for _ in param.shape)
    seen: set[Box] = set()
    boxes = []
    for rank in range(size):
        box = param.box(rank)
        boxes.append(empty if box in seen else box)
        seen.add(box)
    return boxes.__getitem__


def _write(tmp: Path, header: dict[str, Any],
           tensors: Iterator[tuple[str, np.ndarray | None]]) -> None:
    with h5py.File(tmp, "w") as h5:
        h5.attrs.update(header)
        for name, whole in tensors:
            _write_tensor(h5, name, whole, header["dtype"])


def _write_tensor(h5: h5py.File, name: str, whole: np.ndarray, dtype: str) -> None:
    h5.create_dataset(name, data=whole, dtype=dtype)  # the gather's float64, in training dtype


# --- reading ---------------------------------------------------------------------------------


def load_checkpoint(path: Path, network: Network, optimizer: Optimizer | None
                    ) -> CheckpointInfo:
    """Fill ``network``'s parameter shards and ``optimizer``'s state from ``path`` (the
    weights and buffers alone for no optimizer, as ``predict`` takes them). Collective.

    The optimizer must be the one that wrote the checkpoint (its state means nothing to
    another); any plan, P and precision may read it.

    Every rank opens the file read-only and reads only its own block (``param.box(rank)``) of
    each tensor, so any plan on any number of ranks can load any checkpoint of the same net.
    Values are converted to the network's dtype; a block holding NaN or Inf is refused, naming
    the tensor (training from it could only give a NaN loss, blamed on the rate). The ranks
    agree before returning: if any rank fails (say the file is not visible on its node) every
    rank raises the same :class:`~hpctrain.run.checkpoint_file.CheckpointError`, so none goes
    on to train alone. Build the network and data with ``info.seed`` and resume at batch
    ``info.step``.
    """
    path = Path(path)
    xp, dtype = network.backend.xp, network.backend.precision.master
    rank = network.grids.world.Get_rank()
    failure, info = None, None
    try:
        with open_checkpoint(path) as h5:
            info = validated_header(h5, path, network.net)
            if optimizer is not None:
                check_optimizer(info, optimizer.name)
                optimizer.steps = (info.step if info.optimizer_steps is None
                                   else info.optimizer_steps)

            def read(group: str, tensor: Parameter) -> Any:
                """This rank's block of ``group/NAME``, in the network's dtype and device."""
                where = tuple(slice(lo, hi) for lo, hi in tensor.box(rank))
                block = finite_block(h5, f"{group}/{tensor.name}", where, path)
                return xp.asarray(block.astype(dtype, copy=False))

            for k, param in enumerate(network.params):
                param.set_weights(read("params", param))
                if optimizer is not None:
                    for name, values in optimizer.state.items():
                        values[k] = read(name, param)
            for buffer in network.buffers:
                buffer.value[...] = read("buffers", buffer)
    except CheckpointError as err:
        failure = str(err)
    except OSError as err:  # a header fine but a tensor cut short: a truncated file
        failure = f"checkpoint {path} cannot be read ({err}); it may be truncated, use another"
    failures = [f for f in network.grids.world.allgather(failure) if f is not None]
    if failures:
        raise CheckpointError(failures[0])
    return info


def check_optimizer(info: CheckpointInfo, name: str) -> None:
    """Refuse to continue a checkpoint with an optimizer other than the one that wrote it."""
    written = info.optimizer
    if written != name:
        raise CheckpointError(f"checkpoint {info.path} was written with --optimizer {written}, "
                              f"not {name}; resume with --optimizer {written} (its state is "
                              f"that optimizer's)")


def resume_from(resume: str | None, checkpoint_dir: str | None, seed: int | None, batch: int,
                net: NetSpec) -> tuple[Path | None, CheckpointInfo | None]:
    """The checkpoint a run resumes from and what it says, or (None, None) to start afresh.

    Parameters
    ----------
    resume : ``--resume``: a checkpoint file or directory, "latest" (the newest in
        ``checkpoint_dir``, or a fresh start when there is none), or None for a fresh run.
    checkpoint_dir : ``--checkpoint-dir``, where the run writes its checkpoints, or None.
    seed : ``--seed``, or None to take the checkpoint's.
    batch : ``--batch``, which must be the checkpoint's.
    net : the net the checkpoint must hold.

    Raises
    ------
    UserError
        A bare ``--resume`` without a directory, a seed or batch other than the checkpoint's,
        or a ``checkpoint_dir`` holding checkpoints of another trajectory: newer than the one
        resumed, or any at all for a fresh run (keeping the newest few would delete them, and
        a later bare ``--resume`` would pick the wrong one).
    """
    newest = latest_checkpoint(Path(checkpoint_dir)) if checkpoint_dir else None
    path = info = None
    if resume == "latest" and not checkpoint_dir:
        raise UserError("bare --resume takes the newest checkpoint in --checkpoint-dir; give "
                        "--checkpoint-dir DIR or --resume PATH")
    if resume is not None:
        path = newest if resume == "latest" else resolve_resume(Path(resume))
    if path is not None:
        info = read_checkpoint_info(path, net)
        if seed is not None and seed != info.seed:
            raise UserError(f"checkpoint {path} was written with --seed {info.seed}, not "
                            f"{seed}; drop --seed or pass --seed {info.seed}")
        written = info.state.get("batch", batch)
        if written != batch:
            raise UserError(f"checkpoint {path} was written with --batch {written}; resume with "
                            f"--batch {written} (what step N reads depends on it)")
    step = info.step if info else -1
    if newest is not None and step_of(newest) > step:
        what = f"is newer than step {step} resumed" if info else "belongs to another run"
        raise UserError(f"--checkpoint-dir {checkpoint_dir} holds {newest.name}, which "
                        f"{what}; resume from it (--resume), or use an empty directory")
    return path, info
