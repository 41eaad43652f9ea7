"""The net ``--net`` names: a shipped net, a ``.net`` file, or an ONNX model (``.onnx``), with
the loss ``--loss`` asks for.

A ``.net`` file says its loss on its input line (``classes=`` or ``targets=``); an ONNX model
that hpctrain exported keeps it in its metadata; a model exported from PyTorch says nothing, and
then the dataset decides (labels: cross-entropy, targets: the mean squared error; see
:func:`for_answers`), else cross-entropy. ``--loss`` says it outright.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hpctrain.errors import shown, shown_path
from hpctrain.model.net import NetError, NetSpec, load_net

if TYPE_CHECKING:
    from hpctrain.data.dataset_format import DatasetInfo

LOSSES = ("auto", "cross-entropy", "mse")
MODEL_SUFFIX = ".onnx"


def is_model(name: str) -> bool:
    """Whether ``--net`` names an ONNX model (by its suffix)."""
    return name.lower().endswith(MODEL_SUFFIX)


def load_network(name_or_path: str, image_size: int | None = None, loss: str = "auto"
                 ) -> NetSpec:
    """The net ``name_or_path`` names, at ``image_size`` when given, trained on ``loss``
    (``LOSSES``)."""
    if loss not in LOSSES:
        raise NetError(f"--loss {shown(loss)} must be one of {', '.join(LOSSES)}")
    if is_model(name_or_path):  # its importer only where it is read: planning a .net loads none
        from hpctrain.interchange.onnx_import import import_onnx

        return import_onnx(name_or_path, image_size,
                           None if loss == "auto" else loss == "mse").net
    net = load_net(name_or_path, image_size)
    if loss != "auto" and (loss == "mse") != net.regression:
        said = f"targets={net.classes}" if net.regression else f"classes={net.classes}"
        raise NetError(f"--loss {loss}: net {shown_path(net.name)} says {said} on its "
                       f"input line; drop --loss, or change the net file")
    return net


def net_for_dataset(net: NetSpec, info: DatasetInfo, resize: bool, batch: int) -> NetSpec:
    """``net`` as a dataset of ``info`` sets it: its images' (or volumes') size where
    ``resize`` (no ``--image-size`` said otherwise), and its loss where the net says none
    (:func:`for_answers`); refused, naming the fix, when the dataset does not fit it or holds
    fewer than ``batch`` training samples (:func:`~hpctrain.data.dataset_fit.check_fits`)."""
    from hpctrain.data.dataset_fit import check_fits, dataset_image_size

    size = dataset_image_size(info.sample_shape, net.input_shape)
    if resize and size is not None:
        net = net.with_image_size(size)
    net = for_answers(net, bool(info.targets))
    check_fits(info, net.input_shape, net.classes, batch, regression=net.regression)
    return net


def for_answers(net: NetSpec, targets: bool) -> NetSpec:
    """``net`` regressing when the data holds ``targets`` (else classifying), where its loss
    was not said; as it is otherwise."""
    if net.loss_given or net.regression == targets:
        return net
    return replace(net, regression=targets)
