"""A net as a flat ``.net`` text (:func:`hpctrain.model.net_text.net_text`) and the dotted layer
names such texts carry (``layer2.0.conv1``, ``features.0``, ``0``).

The text of a net reads back (:func:`~hpctrain.model.net.parse_net`) to an equal net: every
shipped net, at its own and another image size, with batch-norm statistics groups, dotted names,
``ceil=1``, ``count_pad=0``, ``group=rank`` and regression targets; and writing what was read
gives the same text again. Bad names are refused in one line. Parsing only: fast and serial."""

import re

import pytest

from hpctrain.model.net import (
    INPUT,
    MAX_NAME,
    NetError,
    available_nets,
    check_layer_name,
    load_net,
    parse_net,
)
from hpctrain.model.net_text import input_line, net_text


def round_trip(net):
    """``net`` written and read back, after checking the text is a fixed point."""
    text = net_text(net)
    again = parse_net(text, net.name)
    assert net_text(again) == text
    return again


def image_nets():
    return [name for name in available_nets() if len(load_net(name).input_shape) > 1]


def net_with_norms():
    return [name for name in available_nets() if any(
        layer.kind == "batchnorm" for layer in load_net(name).layers)]


# -- shipped nets -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", available_nets())
def test_every_shipped_net_reads_back_equal(name):
    net = load_net(name)
    again = round_trip(net)
    assert again == net
    assert [layer.name for layer in again.layers] == [layer.name for layer in net.layers]
    assert again.out_shapes == net.out_shapes and again.regression == net.regression
    assert again.param_shapes() == net.param_shapes()
    assert again.buffer_shapes() == net.buffer_shapes()


# nets that take sizes of a multiple only (DeepCAM's decoder doubles four times what its encoder
# halves four times: a class score per pixel needs a multiple of 16)
SIZE_STEPS = {"deepcam": 16}


@pytest.mark.parametrize("name", image_nets())
def test_a_shipped_net_at_another_image_size_reads_back_equal(name):
    """The text gives the net's own size (not the file's), and reads back to the resized net
    rather than the shipped one."""
    net = load_net(name)
    resized = net.with_image_size(net.input_shape[1] - SIZE_STEPS.get(name, 1))
    text = net_text(resized)
    assert input_line(resized) == text.splitlines()[0]
    assert "x".join(map(str, resized.input_shape[1:])) in text.splitlines()[0]
    again = round_trip(resized)
    assert again == resized and again != net
    assert again.out_shapes == resized.out_shapes


def test_a_chain_writes_no_in_and_a_graph_names_what_each_line_reads():
    """``in=`` only where a layer reads other than the line before, naming what it reads."""
    assert "in=" not in net_text(load_net("alexnet"))
    net = load_net("resnet18")
    lines = net_text(net).splitlines()[1:]
    previous = INPUT
    for layer, line in zip(net.layers, lines, strict=True):
        words = line.split()
        assert words[:2] == [layer.kind, f"name={layer.name}"]
        reads = [w for w in words if w.startswith("in=")]
        if layer.inputs == (previous,):
            assert not reads, line
        else:
            assert reads == [f"in={','.join(layer.inputs)}"], line
        previous = layer.name


@pytest.mark.parametrize("name", net_with_norms())
def test_a_net_with_statistics_groups_reads_back_to_what_the_same_choice_makes(name):
    """The text of a net made for 4 ranks with per-rank statistics reads back to a net that
    the same choice (``--bn-group rank`` on 4 ranks) makes equal to it."""
    net = load_net(name)
    grouped = net.with_statistics("rank", 4)
    assert any(layer.options.groups > 1 for layer in grouped.layers
               if layer.kind == "batchnorm")
    assert round_trip(grouped).with_statistics("rank", 4) == grouped


# -- the new options and names --------------------------------------------------------------

OPTIONS_NET = """input channels=3 size=12x10 {answers}
conv name=features.0 out=4 kernel=3 pad=1 bias=0
batchnorm name=features.1 group=rank eps=1e-3 momentum=0.25
relu name=features.2
maxpool name=features.3 kernel=3 stride=2 ceil=1
avgpool name=0 in=features.2 kernel=3 stride=2 pad=1 count_pad=0
avgpool name=layer2.0.pool in=features.2 kernel=3 stride=2 pad=1
maxpool name=layer2.0.max in=features.2 kernel=3 stride=2 pad=1+0x0+1 ceil=1
concat name=cat in=features.3,0,layer2.0.pool,layer2.0.max
batchnorm name=bn-2 group=2
avgpool name=head.pool kernel=global
flatten
linear name=classifier.1 out=5
"""


@pytest.mark.parametrize("answers", ["classes=5", "targets=5"])
def test_dotted_names_and_the_pool_options_read_back_equal(answers):
    """Dotted names, ``ceil=1`` (written with the file's padding, not the grown one),
    ``count_pad=0`` and ``=1``, ``group=rank`` and ``group=2``, ``kernel=global``, classes and
    regression targets."""
    net = parse_net(OPTIONS_NET.format(answers=answers), "options.net")
    assert net.regression == answers.startswith("targets")
    text = net_text(net)
    pools = {layer.name: layer for layer in net.layers}
    assert pools["features.3"].options.ceil_pad and any(
        a > b for b, a in pools["features.3"].options.pad)  # ceil grew the padding
    line = next(line for line in text.splitlines() if "name=features.3 " in line)
    assert "pad=0+0x0+0" in line and "ceil=1" in line
    line = next(line for line in text.splitlines() if "name=layer2.0.max " in line)
    assert "pad=1+0x0+1" in line
    assert "count_pad=0" in next(line for line in text.splitlines() if "name=0 " in line)
    assert "kernel=global" in text and "group=rank" in text and "group=2" in text
    assert text.splitlines()[0].endswith(answers)
    again = round_trip(net)
    assert again == net
    for layer, read in zip(net.layers, again.layers, strict=True):
        assert read.options == layer.options, layer.name
        assert read.inputs == layer.inputs, layer.name
    grouped = net.with_statistics("rank", 4)
    assert round_trip(grouped).with_statistics("rank", 4) == grouped


def test_a_resized_net_with_ceil_reads_back_at_its_size():
    """A ceil pool's grown padding is for one size: the text of the resized net writes the
    file's padding, and reading it grows it for the new size."""
    net = parse_net(OPTIONS_NET.format(answers="classes=5"), "options.net")
    for size in (14, 16, 20):
        resized = net.with_image_size(size)
        assert round_trip(resized) == resized
        assert net_text(resized).replace(f"size={size}x{size}", "size=12x10") == net_text(net)


def test_dotted_names_in_name_and_in():
    """``name=`` takes PyTorch's module paths and bare numbers, ``in=`` names them, and a block
    instance takes one too: its layers' names extend it."""
    net = parse_net("""input channels=2 size=8 classes=3
define basic out
  conv out=$out kernel=3 pad=1 bias=0
  batchnorm
  relu
end
conv name=0 out=4 kernel=3 pad=1
relu name=features.1
use basic name=layer1.0 out=4
conv name=layer2.0.downsample.0 in=0 out=4 kernel=1
add name=layer2.0 in=layer1.0,layer2.0.downsample.0,features.1
conv name=_x-y.Z_9 out=4 kernel=1
avgpool kernel=global
flatten
linear name=fc out=3
""", "dotted.net")
    by_name = {layer.name: layer for layer in net.layers}
    assert [layer.name for layer in net.layers][:6] == [
        "0", "features.1", "layer1.0.conv1", "layer1.0.batchnorm1", "layer1.0.relu1",
        "layer2.0.downsample.0"]
    assert by_name["features.1"].inputs == ("0",)
    assert by_name["layer1.0.conv1"].inputs == ("features.1",)
    assert by_name["layer2.0.downsample.0"].inputs == ("0",)
    assert by_name["layer2.0"].inputs == ("layer1.0.relu1", "layer2.0.downsample.0",
                                          "features.1")
    assert by_name["_x-y.Z_9"].inputs == ("layer2.0",)
    assert net.out_shapes[net.index["layer2.0"]] == (4, 8, 8)
    assert "layer2.0.downsample.0.weight" in net.param_shapes()
    assert "layer1.0.batchnorm1.running_mean" in net.buffer_shapes()
    assert round_trip(net) == net


def test_a_name_of_the_longest_length_is_read_and_written():
    name = "a." * ((MAX_NAME - 1) // 2) + "b" * (1 + (MAX_NAME - 1) % 2)
    assert len(name) == MAX_NAME
    net = parse_net(f"input features=4 classes=2\nlinear name={name} out=3\nrelu in={name}\n"
                    f"linear out=2\n", "long.net")
    assert net.layers[0].name == name and net.layers[1].inputs == (name,)
    assert round_trip(net) == net


def test_a_net_whose_block_names_grow_past_the_limit_reads_back():
    """Either such a net is refused when parsed, or its text reads back: never a net whose
    text cannot be read."""
    text = (f"input channels=2 size=6 classes=3\ndefine blk\n  conv out=2 kernel=1\nend\n"
            f"use blk name={'b' * MAX_NAME}\nflatten\nlinear out=3\n")
    try:
        net = parse_net(text, "long-blocks.net")
    except NetError:
        return
    assert parse_net(net_text(net), net.name) == net


# -- refusals -----------------------------------------------------------------------------------

BAD_NAMES = ["a..b", ".a", "a.", "input", "x" * (MAX_NAME + 1), "a b", "a,b", "a/b", "-a",
             "layer2.0.conv1 ", "", "a.b..c", "é"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n[:12]))
def test_bad_layer_names_are_refused_in_one_line(name):
    with pytest.raises(NetError) as err:
        check_layer_name(name, "t.net, line 2")
    text = str(err.value)
    assert "\n" not in text and text.startswith("t.net, line 2: name "), text
    assert f"at most {MAX_NAME} characters" in text


@pytest.mark.parametrize("line", ["relu name=a..b", "relu name=input", "relu name=.x",
                                  f"relu name={'x' * (MAX_NAME + 1)}", "relu name=a.",
                                  "use blk name=a..b", "use blk name=input"])
def test_bad_names_in_a_net_file_are_refused_in_one_line_naming_the_line(line):
    text = (f"input channels=2 size=4 classes=2\ndefine blk\n  relu\nend\nconv out=2 kernel=1\n"
            f"{line}\nflatten\nlinear out=2\n")
    with pytest.raises(NetError) as err:
        parse_net(text, "t.net").out_shapes  # noqa: B018
    message = str(err.value)
    assert "\n" not in message, message
    assert re.match(r"t\.net, line 6: name '", message), message


def test_good_names_pass_the_check():
    for name in ["0", "features.0", "layer2.0.conv1", "_a", "a-b.c_d.1", "x" * MAX_NAME,
                 "input.0", "a.-b"]:
        check_layer_name(name, "here")
