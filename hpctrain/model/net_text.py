"""A net as a flat ``.net`` text: one line per layer, every option written out, which
:func:`~hpctrain.model.net.parse_net` reads back to an equal net (batch norm's statistics groups
aside: they are the run's, for its number of ranks, and
:meth:`~hpctrain.model.net.NetSpec.with_statistics` sets them again; a layer's ``group=`` is
kept).

What a checkpoint keeps of its net, so that ``export`` and ``predict`` rebuild it from the
checkpoint alone (a net imported from ONNX, or one whose file has moved since). Blocks are
expanded: a layer's full name (``layer2.0.conv1``) is its ``name=``, and each window gives its
sizes per axis (``kernel=3x3 stride=1x1 pad=1+1x1+1``), so the text says everything the layers
are.

>>> from hpctrain.model.net import load_net, parse_net
>>> net = load_net("smallcnn")
>>> print(net_text(net).splitlines()[1])
conv name=conv1 out=16 kernel=3x3 stride=1x1 pad=1+1x1+1 bias=1
>>> parse_net(net_text(net), net.name) == net
True
"""

from __future__ import annotations

from hpctrain.model.kinds import KINDS
from hpctrain.model.net import INPUT, NetSpec


def input_line(net: NetSpec) -> str:
    """The ``input`` line of ``net``: its per-sample shape and its classes, or targets."""
    answers = f"{'targets' if net.regression else 'classes'}={net.classes}"
    if len(net.input_shape) == 1:
        return f"input features={net.input_shape[0]} {answers}"
    channels, *spatial = net.input_shape
    return f"input channels={channels} size={'x'.join(map(str, spatial))} {answers}"


def net_text(net: NetSpec) -> str:
    """``net`` as a flat ``.net`` text (blocks expanded, every option written); ``in=`` only
    where a layer reads other than the line before."""
    lines = [input_line(net)]
    previous = INPUT
    for spec in net.layers:
        words = [spec.kind, f"name={spec.name}"]
        if spec.inputs != (previous,):
            words.append(f"in={','.join(spec.inputs)}")
        texts = KINDS[spec.kind].option_texts(spec.options)
        words += [f"{key}={value}" for key, value in texts.items()]
        lines.append(" ".join(words))
        previous = spec.name
    return "\n".join(lines) + "\n"
