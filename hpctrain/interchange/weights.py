"""Weights files: the tensors of an ONNX model or a safetensors state dict matched to a net by
PyTorch's names, and a net's trained tensors written as a safetensors state dict.

Matching is strict, as PyTorch's ``load_state_dict(strict=True)``: every parameter and buffer of
the net must be in the file with its shape, and every tensor of the file must have a place in
the net (batch norm's ``num_batches_tracked`` aside, which hpctrain does not keep). The layers
of ``--init-except`` keep the weights drawn from the seed, and the file's tensors of those
modules are left out: the usual fine-tune, a 1000-class head replaced by a 10-class one, is
``--init-except fc``. Anything else is refused in one line, naming the layers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpctrain.errors import UserError, one_line, shown_path
from hpctrain.interchange.onnx_import import ONNX_EXTRA, import_onnx
from hpctrain.interchange.torch_names import (
    TRACKED,
    module_names,
    torch_names,
    torch_shapes,
    tracked_counts,
)
from hpctrain.model.net import NetSpec, StartingWeights

EXPORT_MARK = "hpctrain export"  #: the metadata hpctrain's exports carry
SHOWN = 6  # names listed in a refusal before "and N more"


class WeightsError(UserError):
    """A weights file that cannot be read, or does not fit the net."""


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def file_tensors(path: Path, net: NetSpec) -> dict[str, np.ndarray]:
    """PyTorch name → whole array of every tensor in ``path``: an ONNX model (its initializers,
    as the net it imports to names them) or a safetensors state dict."""
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        imported = import_onnx(path, fallback_size=_image_size(net))
        names = torch_names(imported.net)
        return {names[ours]: value for ours, value in imported.weights.items()}
    if suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise WeightsError(f"reading {shown_path(path)} needs the "
                               f"safetensors package; install it with {ONNX_EXTRA}") from None
        if not path.is_file():
            raise WeightsError(f"{shown_path(path)}: no such file; give the path "
                               f"of a safetensors state dict")
        try:
            return dict(load_file(str(path)))
        except Exception as err:  # noqa: BLE001 - the Rust reader's errors come as several types
            raise WeightsError(f"{shown_path(path)}: not a readable safetensors "
                               f"file ({one_line(str(err), 120)})") from None
    raise WeightsError(f"{shown_path(path)}: weights come from an ONNX model "
                       f"(.onnx) or a safetensors state dict (.safetensors)")


def _image_size(net: NetSpec) -> int | None:
    """The net's spatial size where all its spatial axes have one (an image, a volume)."""
    spatial = set(net.input_shape[1:])
    return spatial.pop() if len(spatial) == 1 else None


def fresh_layers(net: NetSpec, names: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(the net's layers that keep fresh weights, the file's modules left out) for the names of
    ``--init-except``. A name covers a layer and every layer under it, by hpctrain's name or
    PyTorch's: ``fc``, ``layer2_0.conv1`` or ``layer2.0.conv1``, and ``layer4`` for all of
    ``layer4.*``; the file's tensors under it are left out too, whether the net has such layers
    or not (a head the net lacks)."""
    modules = module_names(net)
    layers: set[str] = set()
    for name in names:
        layers |= {layer for layer, module in modules.items()
                   if _under(layer, name) or _under(module, name)}
    return layers, set(names) | {modules[layer] for layer in layers}


def _under(name: str, prefix: str) -> bool:
    """Whether ``name`` is ``prefix`` or a module under it (``layer4.0.conv1`` under ``layer4``,
    not ``layer40``)."""
    return name == prefix or name.startswith(prefix + ".")


def read_weights(source: StartingWeights, net: NetSpec) -> dict[str, np.ndarray]:
    """hpctrain name → whole array of each parameter and buffer of ``net`` from ``source``,
    all but those of its fresh layers; refused in one line where the file and the net do not
    match, or the file holds NaN or Inf."""
    path = Path(source.path)
    tensors = file_tensors(path, net)
    fresh, skipped = fresh_layers(net, source.fresh)
    modules = module_names(net)
    unused = [name for name in source.fresh
              if not any(_under(layer, name) or _under(modules[layer], name) for layer in fresh)
              and not any(_under(t.rpartition(".")[0], name) for t in tensors)]
    file = shown_path(path)
    if unused:
        raise WeightsError(f"--init-except {', '.join(unused)}: no layer of net "
                           f"{shown_path(net.name)} and no module of {file} is called "
                           f"so")
    shapes = {**net.param_shapes(), **net.buffer_shapes()}
    reshaped = torch_shapes(net)
    found: dict[str, np.ndarray] = {}
    missing, mismatched, used = [], [], set()
    for ours, theirs in torch_names(net).items():
        layer = ours.rpartition(".")[0]
        if layer in fresh:
            continue
        if theirs not in tensors:
            missing.append(f"{theirs} (layer {layer})")
            continue
        used.add(theirs)
        value = tensors[theirs]
        if ours in reshaped and tuple(value.shape) == reshaped[ours]:
            value = value.reshape(shapes[ours])  # PyTorch's Linear of a 1x1 convolution
        if tuple(value.shape) != tuple(shapes[ours]):
            mismatched.append(f"layer {layer}: {ours.rpartition('.')[2]} {tuple(shapes[ours])} "
                              f"in the net, {tuple(value.shape)} in the file")
            continue
        if not np.isfinite(value).all():
            raise WeightsError(f"{file}: tensor {theirs} holds NaN or Inf; give a file of "
                               f"finite weights, or keep layer {layer} fresh with "
                               f"--init-except {layer}")
        found[ours] = value
    tracked = set(tracked_counts(net))
    extra = [name for name in tensors if name not in used and name not in tracked
             and not name.endswith("." + TRACKED)
             and not any(_under(name.rpartition(".")[0], module) for module in skipped)]
    if mismatched:
        layers = sorted({m.split(":")[0].removeprefix("layer ") for m in mismatched})
        raise WeightsError(f"{file} does not fit net {shown_path(net.name)}: "
                           f"{'; '.join(mismatched[:SHOWN])}; keep fresh weights for those "
                           f"layers with --init-except {','.join(layers)}")
    if missing:
        raise WeightsError(f"{file} lacks {len(missing)} tensor(s) of net "
                           f"{shown_path(net.name)}: {_listed(missing)}; give a file "
                           f"of this net, or keep those layers fresh with --init-except")
    if extra:
        raise WeightsError(f"{file} holds {len(extra)} tensor(s) net "
                           f"{shown_path(net.name)} has no place for: "
                           f"{_listed(extra)}; leave their modules out with --init-except")
    return found


def state_dict(net: NetSpec, tensors: dict[str, np.ndarray], steps: int = 0
               ) -> dict[str, np.ndarray]:
    """``tensors`` (hpctrain names, every parameter and buffer of ``net``) under PyTorch's
    names, with each batch norm's ``num_batches_tracked`` (``steps``, the training forwards it
    counts): what ``model.load_state_dict(..., strict=True)`` takes."""
    names, reshaped = torch_names(net), torch_shapes(net)
    found = {}
    for name, value in tensors.items():
        array = np.ascontiguousarray(value)
        found[names[name]] = array.reshape(reshaped[name]) if name in reshaped else array
    for name in tracked_counts(net):
        found[name] = np.array(steps, dtype=np.int64)
    return found


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]
                      ) -> None:
    """Write a state dict into the file ``path`` (the caller's temporary, which it renames),
    marked as hpctrain's (:func:`is_our_state_dict`). Written through the file as it is, which
    keeps the mode the caller gave it (``save_file`` makes a file of its own, readable by its
    owner alone)."""
    from safetensors.numpy import save

    path.write_bytes(save(tensors, metadata={"format": "pt", "writer": EXPORT_MARK,
                                             **metadata}))


def is_our_state_dict(path: Path) -> bool:
    """Whether ``path`` is a safetensors file hpctrain wrote (its metadata says so)."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as file:
            return (file.metadata() or {}).get("writer") == EXPORT_MARK
    except Exception:  # noqa: BLE001 - anything unreadable is not ours
        return False
