"""The checkpoint file: its format, what a checkpoint says and holds, read in one process
without MPI, and the directory of a run's checkpoints. Saving and loading a running network
(collective) are :mod:`hpctrain.run.checkpoint`, whose docstring gives the layout.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpctrain.cost.memory import OPTIMIZER_STATE
from hpctrain.errors import UserError
from hpctrain.io.files import is_hdf5_of, remove_orphans
from hpctrain.io.seeds import check_seed
from hpctrain.model.net import NetError, NetSpec, parse_net

FORMAT = "hpctrain-checkpoint"
VERSION = 1
GROUPS = ("params", "momentum")  # what an SGD checkpoint holds per parameter (older ones too)


def state_groups(optimizer: str) -> tuple[str, ...]:
    """The groups a checkpoint holds a tensor of per parameter: ``params``, then the state of
    ``optimizer`` (``momentum``; ``exp_avg`` and ``exp_avg_sq``)."""
    return ("params", *OPTIMIZER_STATE[optimizer])
_FILE_NAME = re.compile(r"^step-(\d+)\.h5$")


class CheckpointError(UserError):
    """A checkpoint that cannot be written, found or used; the message names the file."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about the run that wrote it (its tensors are not loaded)."""

    path: Path
    step: int  # steps completed: the next step to train
    seed: int
    plan: str  # the writer's plan, in plan-file format
    state: dict[str, Any]
    dtype: str
    optimizer: str = "sgd"  # the --optimizer whose state it holds (SGD before others existed)
    optimizer_steps: int | None = None  # the updates it made (None: as many as ``step``)


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint hpctrain wrote (its ``format`` attribute says so)."""
    return is_hdf5_of(path, FORMAT)


# --- reading ---------------------------------------------------------------------------------


def tensor_shapes(net: NetSpec) -> dict[str, tuple[int, ...]]:
    """Name → whole shape of each parameter of ``net``: what a checkpoint of it holds."""
    return net.param_shapes()


def read_checkpoint_info(path: Path, net: NetSpec) -> CheckpointInfo:
    """Check that ``path`` is a complete checkpoint of ``net``; its header, no tensors loaded.

    Raises :class:`CheckpointError` naming the file for: no such file, not HDF5 or truncated,
    not an hpctrain checkpoint or another version, another net, other layers, or a tensor
    missing or of the wrong shape for ``net``.
    """
    path = Path(path)
    with open_checkpoint(path) as h5:
        return validated_header(h5, path, net)


def finite_block(h5: h5py.File, name: str, where: tuple[slice, ...], path: Path) -> np.ndarray:
    """Block ``where`` of tensor ``name``; a :class:`CheckpointError` naming it if it holds NaN
    or Inf (one pass over the block)."""
    block = h5[name][where]
    if not np.isfinite(block).all():
        value = "NaN" if np.isnan(block).any() else "Inf"
        raise CheckpointError(f"checkpoint {path}: tensor /{name} holds {value}; resume from an "
                              f"earlier checkpoint")
    return block


def open_checkpoint(path: Path) -> h5py.File:
    """``h5py.File(path, "r")``, its failures a :class:`CheckpointError` naming the file."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; give an existing file, or a "
                              f"directory of step-*.h5 files")
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise CheckpointError(f"checkpoint {path} is not a readable HDF5 file (truncated or "
                              f"corrupt?): {err}; use another checkpoint") from None


def validated_header(h5: h5py.File, path: Path, net: NetSpec) -> CheckpointInfo:
    """The header of an open checkpoint, after checking it fits ``net`` and holds its tensors
    (:func:`tensor_shapes`, and the buffers)."""
    attrs = h5.attrs
    if attrs.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an hpctrain checkpoint (no format attribute "
                              f"'{FORMAT}'); give a file written by hpctrain")
    if attrs.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has version {attrs.get('version')}; this "
                              f"hpctrain reads version {VERSION}")
    try:
        steps = attrs.get("optimizer_steps")
        info = CheckpointInfo(path, int(attrs["step"]), int(attrs["seed"]), str(attrs["plan"]),
                              json.loads(attrs["state"]), str(attrs["dtype"]),
                              str(attrs.get("optimizer", "sgd")),
                              None if steps is None else int(steps))
        written_for, layers = str(attrs["net"]), [str(name) for name in attrs["layers"]]
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} has a damaged header ({err!r}); use another "
                              f"checkpoint") from None
    try:
        check_seed(info.seed, "seed")
    except UserError as err:
        raise CheckpointError(f"checkpoint {path} has a damaged header ({err}); use another "
                              f"checkpoint") from None
    ours = net.architecture()  # the network, not the name its file was given
    if layers != ours:
        k = next((k for k, (a, b) in enumerate(zip(layers, ours)) if a != b),
                 min(len(layers), len(ours)))
        there = layers[k] if k < len(layers) else "nothing"
        here = ours[k] if k < len(ours) else "nothing"
        which = (f"another version of net {net.name}" if written_for == net.name
                 else f"net {written_for}, not {net.name}")
        raise CheckpointError(f"checkpoint {path} was written for {which}: layer {k + 1} is "
                              f"'{there}' there but '{here}' here; give a checkpoint of this "
                              f"architecture")
    if info.optimizer not in OPTIMIZER_STATE:
        raise CheckpointError(f"checkpoint {path} was written by optimizer "
                              f"{info.optimizer!r}, which this hpctrain does not know; use "
                              f"another checkpoint")
    expected = [(group, name, shape) for group in state_groups(info.optimizer)
                for name, shape in tensor_shapes(net).items()]
    expected += [("buffers", name, shape) for name, shape in net.buffer_shapes().items()]
    for group, name, shape in expected:
        if not isinstance(h5.get(f"{group}/{name}"), h5py.Dataset):
            raise CheckpointError(f"checkpoint {path} lacks /{group}/{name}; it is "
                                  f"incomplete, use another checkpoint")
        found = h5[f"{group}/{name}"].shape
        if found != tuple(shape):
            raise CheckpointError(f"checkpoint {path} holds /{group}/{name} of shape "
                                  f"{found} but net {net.name} needs {tuple(shape)}; was it "
                                  f"written with another --image-size or net file?")
    return info


# --- a directory of checkpoints --------------------------------------------------------------


def checkpoint_path(directory: Path, step: int) -> Path:
    """``directory/step-00000120.h5`` for ``step`` 120: names sort by step."""
    if step < 0:
        raise ValueError(f"step {step} must be non-negative")
    return Path(directory) / f"step-{step:08d}.h5"


def step_of(path: Path) -> int:
    """The step in a checkpoint's file name: ``step-00000120.h5`` -> 120."""
    match = _FILE_NAME.match(Path(path).name)
    if not match:
        raise CheckpointError(f"{path} is not named like a checkpoint (step-NNNNNNNN.h5)")
    return int(match.group(1))


def _checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints in ``directory``, oldest first.

    Temporary files of a write in progress (or of a crashed one) start with "." and never
    match; every file that does match was renamed into place complete. Links are not followed
    and never count.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            match = _FILE_NAME.match(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


def remove_temporaries(directory: Path) -> list[Path]:
    """Remove the temporary files a crashed checkpoint write left in ``directory``
    (``.step-NNNNNNNN.h5.XXXXXXXX.tmp``, regular files only); the paths removed. Call it on
    one rank, when no other job writes checkpoints there."""
    return remove_orphans(Path(directory), r"step-\d+\.h5")


def latest_checkpoint(directory: Path) -> Path | None:
    """The complete checkpoint of the highest step in ``directory``; None when there is none."""
    found = _checkpoints(directory)
    return found[-1][1] if found else None


def prune_checkpoints(directory: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints in ``directory``; the deleted paths.

    Call it on one rank (rank 0, after a save). The temporaries of crashed writes go too
    (:func:`remove_temporaries`); other files and links stay.
    """
    if keep < 1:
        raise CheckpointError(f"cannot keep {keep} checkpoints; keep at least 1")
    old = [path for _, path in _checkpoints(directory)[:-keep]]
    for path in old:
        path.unlink(missing_ok=True)
    remove_temporaries(directory)
    return old


def resolve_resume(path_or_dir: Path) -> Path:
    """The checkpoint to resume from: a file as given, or a directory's latest checkpoint."""
    path = Path(path_or_dir)
    if path.is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"no checkpoint in {path}: it holds no step-*.h5 file; give "
                                  f"another directory or a checkpoint file")
        return latest
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; give a checkpoint file or a "
                              f"directory of step-*.h5 files")
    return path




# --- in one process ----------------------------------------------------------------------


def checkpoint_net(path: Path) -> NetSpec:
    """The net a checkpoint was written for, from its ``net_text`` (refused, naming the file,
    when it has none: a checkpoint written before hpctrain kept it; give ``--net`` then)."""
    with open_checkpoint(Path(path)) as h5:
        text, name = h5.attrs.get("net_text"), h5.attrs.get("net")
    if text is None or name is None:
        raise CheckpointError(f"checkpoint {path} does not hold its net (written before "
                              f"checkpoints kept it); give --net with the net it was trained as")
    try:
        return parse_net(str(text), str(name))
    except NetError as err:
        raise CheckpointError(f"checkpoint {path} holds a net that cannot be read ({err}); "
                              f"give --net with the net it was trained as") from None


def whole_tensors(path: Path, net: NetSpec) -> tuple[CheckpointInfo, dict[str, np.ndarray]]:
    """What a checkpoint of ``net`` says, and its parameters and buffers whole by name (no
    optimizer state), read in one process: what ``export`` writes out."""
    path = Path(path)
    with open_checkpoint(path) as h5:
        info = validated_header(h5, path, net)
        found = {}
        try:
            for group, names in (("params", net.param_shapes()),
                                 ("buffers", net.buffer_shapes())):
                for name in names:
                    found[name] = finite_block(h5, f"{group}/{name}", (), path)
        except OSError as err:  # a header fine but a tensor cut short: a truncated file
            raise CheckpointError(f"checkpoint {path} cannot be read ({err}); it may be "
                                  f"truncated, use another") from None
    return info, found
