"""Net format version 2: ``in=``, ``define``/``use``/``repeat`` blocks, the kinds add, concat,
batchnorm and avgpool, non-square windows, the shipped graph nets, and version-1 nets unchanged.
Serial and fast (parsing and shape inference only)."""

import math
import re

import pytest

from hpctrain.model.net import INPUT, NetError, load_net, parse_net

HEAD = "input channels=2 size=8 classes=3\n"
TAIL = "avgpool kernel=global\nflatten\nlinear out=3\n"


def net_of(body: str, head: str = HEAD, tail: str = TAIL):
    return parse_net(head + body + "\n" + tail, "t.net")


def layers(net):
    """name → (kind, inputs) of every layer, in file order."""
    return {layer.name: (layer.kind, layer.inputs) for layer in net.layers}


def shape_of(net, name):
    return net.out_shapes[net.index[name]]


# -- in= -----------------------------------------------------------------------------------


def test_in_defaults_to_the_line_before_and_input_names_the_net_input():
    net = net_of("conv name=a out=4 kernel=3 pad=1\n"
                 "conv name=b in=input out=4 kernel=1\n"
                 "relu\n"
                 "add in=a,b,relu1\n"
                 "concat in=add1,a\n")
    assert layers(net)["a"] == ("conv", (INPUT,))  # the first line reads the input
    assert layers(net)["b"] == ("conv", (INPUT,))
    assert layers(net)["relu1"] == ("relu", ("b",))  # the line before
    assert layers(net)["add1"] == ("add", ("a", "b", "relu1"))  # in order, three inputs
    assert layers(net)["concat1"] == ("concat", ("add1", "a"))
    assert shape_of(net, "concat1") == (8, 8, 8)
    assert net.producers(net.index["add1"]) == (0, 1, 2)
    assert net.producers(0) == (-1,)
    assert net.consumers[0] == (net.index["add1"], net.index["concat1"])  # a is read twice
    assert not net.is_chain()


def test_unnamed_layers_are_numbered_by_position_among_their_kind():
    net = net_of("conv name=stem out=4 kernel=1\nconv out=4 kernel=1\nrelu\n")
    assert [layer.name for layer in net.layers[:3]] == ["stem", "conv2", "relu1"]


def test_add_and_concat_shapes():
    net = net_of("conv name=a out=3 kernel=3\n"
                 "conv name=b in=input out=5 kernel=3x5 pad=0x1 stride=1\n"
                 "maxpool name=c in=input kernel=3 stride=1\n"
                 "concat in=a,b,c\n"
                 "conv name=d out=4 kernel=1\n"
                 "conv name=e in=a out=4 kernel=1\n"
                 "add in=d,e\n")
    assert shape_of(net, "concat1") == (3 + 5 + 2, 6, 6)
    assert shape_of(net, "add1") == (4, 6, 6)
    assert net.param_shapes()["b.weight"] == (5, 2, 3, 5)


# -- blocks ---------------------------------------------------------------------------------

BASIC = """define basic out stride=1
  conv out=$out kernel=3 stride=$stride pad=1 bias=0
  batchnorm
  relu
end
"""


def test_block_instances_are_named_by_name_or_by_block_and_count():
    net = net_of(BASIC + "use basic name=stem out=4 stride=2\n"
                 "use basic out=6\n"
                 "use basic out=6\n"
                 "use basic name=x out=5 repeat=3\n")
    names = [layer.name for layer in net.layers]
    assert names[:9] == ["stem.conv1", "stem.batchnorm1", "stem.relu1",
                         "basic1.conv1", "basic1.batchnorm1", "basic1.relu1",
                         "basic2.conv1", "basic2.batchnorm1", "basic2.relu1"]
    assert names[9:18] == [f"x.{r}.{local}" for r in (1, 2, 3)
                           for local in ("conv1", "batchnorm1", "relu1")]
    # each instance reads the one before; a block's first line reads the block's input
    assert layers(net)["stem.conv1"][1] == (INPUT,)
    assert layers(net)["basic1.conv1"][1] == ("stem.relu1",)
    assert layers(net)["x.2.conv1"][1] == ("x.1.relu1",)
    assert layers(net)["avgpool1"][1] == ("x.3.relu1",)
    # parameters and defaults: stride=2 given once, else the default 1
    assert net.layers[0].options.stride == (2, 2)
    assert net.layers[3].options.stride == (1, 1)
    assert net.layers[3].options.bias is False
    assert shape_of(net, "stem.relu1") == (4, 4, 4)
    assert shape_of(net, "x.3.relu1") == (5, 4, 4)


def test_an_instance_name_stands_for_its_last_line_and_input_for_the_block_input():
    net = net_of("""define residual width
  conv name=c out=$width kernel=3 pad=1
  add in=c,input
  relu name=out
end
conv name=stem out=4 kernel=1
use residual name=r1 width=4
use residual width=4
conv name=side in=r1 out=4 kernel=1
add in=side,residual1,stem
""")
    assert layers(net)["r1.c"][1] == ("stem",)
    assert layers(net)["r1.add1"][1] == ("r1.c", "stem")  # input: what the instance reads
    assert layers(net)["residual1.add1"][1] == ("residual1.c", "r1.out")
    assert layers(net)["side"][1] == ("r1.out",)  # r1: its last line
    assert layers(net)["add1"][1] == ("side", "residual1.out", "stem")


def test_block_parameters_substitute_inside_words():
    net = net_of("""define factor k p out=4
  conv out=$out kernel=1x$k pad=0x$p
  conv name=tall out=$out kernel=$k pad=$p bias=0
end
use factor name=f k=7 p=3
use factor k=3 p=1 out=6
""")
    wide, tall = net.layers[0], net.layers[1]
    assert (wide.name, wide.options.kernel, wide.options.pad) == ("f.conv1", (1, 7),
                                                                  ((0, 0), (3, 3)))
    assert (tall.name, tall.options.kernel, tall.options.pad) == ("f.tall", (7, 7),
                                                                  ((3, 3), (3, 3)))
    assert shape_of(net, "f.conv1") == (4, 8, 8)  # out: its default
    assert net.layers[2].options.kernel == (1, 3) and shape_of(net, "factor1.tall") == (6, 8, 8)


def test_blocks_use_earlier_blocks_and_nest_names():
    net = net_of("""define inner w
  conv out=$w kernel=1
end
define outer w
  use inner w=$w
  use inner name=second w=$w
  relu
end
use outer name=o w=3
use outer w=5
""")
    assert [layer.name for layer in net.layers][:6] == [
        "o.inner1.conv1", "o.second.conv1", "o.relu1",
        "outer1.inner1.conv1", "outer1.second.conv1", "outer1.relu1"]
    assert shape_of(net, "o.relu1") == (3, 8, 8)
    assert layers(net)["outer1.inner1.conv1"][1] == ("o.relu1",)


def test_in_names_a_layer_inside_an_earlier_instance():
    net = net_of(BASIC + "use basic name=b out=4\nconv in=b.conv1 out=4 kernel=1\n"
                 "add in=b,conv1\n")
    assert layers(net)["conv1"][1] == ("b.conv1",)  # numbered in its own scope


def test_a_layer_whose_output_nobody_reads_is_refused():
    with pytest.raises(NetError, match="the output of layer dead is read by no layer"):
        net_of("conv name=c1 out=2 kernel=1\nrelu name=dead\nconv in=c1 out=2 kernel=1\n")


def test_a_repeated_block_name_stands_for_the_last_instance():
    net = net_of(BASIC + "use basic name=x repeat=2 out=4\nrelu in=x\n")
    assert layers(net)["relu1"][1] == ("x.2.relu1",)


def test_nested_repeats_that_expand_too_far_are_refused():
    text = ("define a\n  relu\nend\ndefine b\n  use a repeat=1000\nend\n"
            "define c\n  use b repeat=1000\nend\nuse c repeat=1000\n")
    with pytest.raises(NetError, match="expands to more than 100000 layers"):
        net_of(text)


# -- windows, pools, batch norm ------------------------------------------------------------


def test_non_square_windows_infer_shapes():
    net = parse_net("""input channels=2 height=9 width=7 classes=3
conv out=3 kernel=1x7 pad=0x3
conv out=3 kernel=7x1 pad=3x0 bias=0
conv out=4 kernel=3x2 stride=2x1
avgpool kernel=2x3 stride=1x2 pad=1x1
maxpool kernel=3x1
avgpool kernel=1x2
flatten
linear out=3
""", "w.net")
    assert net.shapes()[:4] == [(2, 9, 7), (3, 9, 7), (3, 9, 7), (4, 4, 6)]
    outs = net.out_shapes
    assert outs[:4] == ((3, 9, 7), (3, 9, 7), (4, 4, 6), (4, 5, 3))
    assert outs[4] == (4, 1, 3)  # maxpool 3x1, its stride the kernel
    assert net.layers[4].options.stride == (3, 1)
    params = net.param_shapes()
    assert params["conv1.weight"] == (3, 2, 1, 7) and params["conv1.bias"] == (3,)
    assert params["conv2.weight"] == (3, 3, 7, 1) and "conv2.bias" not in params
    assert params["conv3.weight"] == (4, 3, 3, 2)


def test_avgpool_options_and_global_pooling():
    net = net_of("avgpool kernel=3 pad=1\navgpool kernel=2 stride=1\n")
    first, second, last = net.layers[0], net.layers[1], net.layers[2]
    assert first.options.kernel == (3, 3) and first.options.stride == (3, 3)  # default: kernel
    assert first.options.pad == ((1, 1), (1, 1))
    assert shape_of(net, "avgpool1") == (2, 3, 3)
    assert second.options.stride == (1, 1) and shape_of(net, "avgpool2") == (2, 2, 2)
    assert last.options.kernel is None  # kernel=global
    assert shape_of(net, "avgpool3") == (2, 1, 1)
    assert not any(name.startswith("avgpool") for name in net.param_shapes())
    tall = parse_net("input channels=3 height=5 width=11 classes=3\navgpool kernel=global\n"
                     "flatten\nlinear out=3\n", "g.net")
    assert tall.out_shapes[0] == (3, 1, 1)


def test_batchnorm_options_parameters_and_buffers():
    net = net_of("conv out=4 kernel=3 bias=0\nbatchnorm\nbatchnorm name=bn eps=1e-3 "
                 "momentum=0.25\n")
    default, given = net.layers[1].options, net.layers[2].options
    assert (default.eps, default.momentum) == (1e-5, 0.1)
    assert (given.eps, given.momentum) == (1e-3, 0.25)
    assert shape_of(net, "bn") == (4, 6, 6)
    params = net.param_shapes()
    assert params["batchnorm1.gamma"] == params["batchnorm1.beta"] == (4,)
    assert params["bn.gamma"] == (4,)
    assert net.buffer_shapes() == {"batchnorm1.running_mean": (4,),
                                   "batchnorm1.running_var": (4,),
                                   "bn.running_mean": (4,), "bn.running_var": (4,)}
    flat = parse_net("input features=6 classes=3\nlinear out=5 bias=0\nbatchnorm\nrelu\n"
                     "linear out=3\n", "flat.net")
    assert flat.buffer_shapes() == {"batchnorm1.running_mean": (5,),
                                    "batchnorm1.running_var": (5,)}
    assert flat.parameter_count() == 6 * 5 + 2 * 5 + 5 * 3 + 3


# -- refusals: one line each, naming the value ------------------------------------------------

REFUSALS = [
    ("unknown in= name", "conv out=2 kernel=3\nrelu in=nosuch\n",
     r"line 3: in='nosuch' names 'nosuch', which is no earlier layer"),
    ("in= names a later line", "relu in=later\nconv name=later out=2 kernel=1\n",
     r"line 2: in='later' names 'later', which is no earlier"),
    ("in= names the layer itself", "relu name=me in=me\n", r"in='me' names 'me'"),
    ("add of mismatched shapes",
     "conv name=a out=2 kernel=3\nconv name=b in=input out=3 kernel=3\nadd in=a,b\n",
     r"layer add1 \(add\) adds a of shape \(2, 6, 6\) and b of shape \(3, 6, 6\)"),
    ("concat of mismatched heights",
     "conv name=a out=2 kernel=3\nconv name=b in=input out=2 kernel=1\nconcat in=a,b\n",
     r"layer concat1 \(concat\) joins a of shape \(2, 6, 6\) and b of shape \(2, 8, 8\)"),
    ("add with one input", "conv name=a out=2 kernel=3\nadd in=a\n",
     r"line 3: add needs two or more inputs"),
    ("concat with one input", "concat\n", r"line 2: concat needs two or more inputs"),
    ("a one-input kind given two", "conv name=a out=2 kernel=1\nrelu in=a,input\n",
     r"line 3: relu reads one input; in= names 2"),
    ("use of an undefined block", "use nosuch\n",
     r"line 2: no block 'nosuch' defined before this line"),
    ("a block using a later block", "define first\n  use second\nend\ndefine second\n  relu\n"
     "end\nuse first\n", r"line 3: no block 'second' defined before this line"),
    ("a block using itself", "define loop\n  use loop\nend\nuse loop\n",
     r"line 3: no block 'loop' defined before this line"),
    ("define without end", "define open\n  relu\n", r"block open \(line 2\) has no 'end'"),
    ("nested define", "define outer\n  relu\n  define inner\n  relu\nend\nend\n",
     r"line 4: a define inside block outer \(line 2\)"),
    ("end without define", "end\n", r"line 2: 'end' alone closes a 'define'; none is open"),
    ("empty block", "define empty\nend\n", r"line 3: block empty has no lines"),
    ("block defined twice", "define b\n  relu\nend\ndefine b\n  relu\nend\n",
     r"line 5: block b is defined twice"),
    ("block named as a kind", "define conv\n  relu\nend\n",
     r"line 2: expected 'define NAME .*got 'define conv'"),
    ("unknown block parameter", "define b w\n  conv out=$w kernel=1\nend\nuse b w=2 colour=red\n",
     r"line 5: block b takes no 'colour'; it takes name, in, repeat, w"),
    ("missing required parameter", "define b w\n  conv out=$w kernel=1\nend\nuse b\n",
     r"line 5: block b needs w="),
    ("$x not a parameter", "define b w\n  conv out=$x kernel=1\nend\nuse b w=2\n",
     r"line 3: '\$x' is not a parameter of this block \(\$w\)"),
    ("$x outside a block", "conv out=$x kernel=1\n",
     r"line 2: '\$x' is not a parameter of this block \(none here\)"),
    ("bad parameter declaration", "define b w=\n  relu\nend\n",
     r"line 2: block parameter 'w=' must be NAME or NAME=DEFAULT"),
    ("a block reads one input", "define b\n  relu\nend\nconv name=c out=2 kernel=1\n"
     "use b in=c,input\n", r"line 6: a block reads one input; in= names 2"),
    ("repeat=0", "define b\n  relu\nend\nuse b repeat=0\n",
     r"line 5: repeat=0 must be a positive integer"),
    ("a layer name used twice", "conv name=a out=2 kernel=1\nrelu name=a\n",
     r"line 3: name 'a' is used twice"),
    ("a block name used twice", "define b\n  relu\nend\nrelu name=x\nuse b name=x\n",
     r"line 6: name 'x' is used twice"),
    ("an auto name taken", "relu name=relu2\nrelu\nrelu\n", r"line \d: name 'relu2' is used twice"),
    ("name=input", "relu name=input\n", r"name 'input' must be letters, digits"),
    ("avgpool kernel=global with stride", "avgpool kernel=global stride=2\n",
     r"line 2: avgpool kernel=global pools the whole image and takes no stride, pad or count_pad"),
    ("avgpool kernel=global with pad", "avgpool kernel=global pad=1\n",
     r"takes no stride, pad or count_pad"),
    ("avgpool of a flat input", "flatten\navgpool kernel=global\n",
     r"layer avgpool1 \(avgpool\) needs an image or volume input, got shape \(128,\)"),
    ("a window of three sizes", "conv out=2 kernel=1x2x3\n",
     r"layer conv1 gives kernel for 3 axes but its input has 2 spatial axes; give one size "
     r"or HxW"),
    ("a window too large", "conv out=2 kernel=1x9\n",
     r"layer conv1 receives 8x8, too small for its window \(kernel 1x9"),
    ("batchnorm eps=0", "batchnorm eps=0\n", r"line 2: eps='?0'? must be in \[1e-300, 1\)"),
    ("batchnorm momentum=1.5", "batchnorm momentum=1.5\n", r"momentum='?1.5'? must be in \[0, 1\]"),
    ("batchnorm unknown key", "batchnorm affine=0\n",
     r"line 2: batchnorm takes no 'affine'; it takes name, in, eps, momentum"),
    ("conv bias=2", "conv out=2 kernel=1 bias=2\n", r"line 2: bias='?2'? must be 0 or 1"),
]


@pytest.mark.parametrize("body,message", [(b, m) for _, b, m in REFUSALS],
                         ids=[what for what, _, _ in REFUSALS])
def test_refusals_are_one_line_naming_the_value(body, message):
    with pytest.raises(NetError) as err:
        net_of(body).out_shapes  # noqa: B018
    text = str(err.value)
    assert "\n" not in text.strip(), text
    assert re.search(message, text), text
    assert text.startswith(("t.net", "net t.net")), text  # the file, and a line or a layer


def test_a_block_used_above_its_define_is_refused():
    with pytest.raises(NetError, match="no block 'late' defined before this line"):
        net_of("use late\ndefine late\n  relu\nend\n")


def test_in_inside_a_block_names_only_its_own_earlier_lines():
    with pytest.raises(NetError, match="in='c' names 'c'"):
        net_of("conv name=c out=2 kernel=1\n"
               "define b\n  relu in=c\n  conv name=c out=2 kernel=1\nend\nuse b\n")


def test_a_bare_use_names_what_is_missing():
    with pytest.raises(NetError, match="'use' needs the block"):
        net_of("use\n")


# -- shipped nets ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,count", [("resnet18", 11_689_512), ("resnet50", 25_557_032),
                                        ("inception_v3", 23_834_568)])
def test_shipped_graph_nets_have_their_parameter_counts(name, count):
    net = load_net(name)
    assert net.parameter_count() == count
    assert net.out_shapes[-1] == (1000,)
    assert not net.is_chain()
    buffers = net.buffer_shapes()
    norms = [layer for layer in net.layers if layer.kind == "batchnorm"]
    assert norms and len(buffers) == 2 * len(norms)
    for layer in norms:
        channels = net.param_shapes()[f"{layer.name}.gamma"]
        assert buffers[f"{layer.name}.running_mean"] == channels
        assert buffers[f"{layer.name}.running_var"] == channels
    assert not set(buffers) & set(net.param_shapes())


def test_resnet_names_follow_torchvision():
    net = load_net("resnet18")
    names = {layer.name for layer in net.layers}
    assert {"conv1", "bn1", "layer1_0.conv1", "layer2_0.downsample", "fc"} <= names
    assert shape_of(net, "layer4_1.relu2") == (512, 7, 7)
    assert net.param_shapes()["layer2_0.downsample.weight"] == (128, 64, 1, 1)


def test_inception_v3_image_sizes():
    assert load_net("inception_v3").input_shape == (3, 299, 299)
    small = load_net("inception_v3", 75)
    assert small.out_shapes[-1] == (1000,)
    assert small.parameter_count() == 23_834_568  # global pooling: no size in any weight
    with pytest.raises(NetError, match=r"layer \S+ receives 2x2, too small") as err:
        load_net("inception_v3", 74)
    assert "\n" not in str(err.value)


def test_resdigits_is_small():
    net = load_net("resdigits")
    assert net.input_shape == (1, 8, 8) and net.out_shapes[-1] == (10,)
    assert net.parameter_count() == 19_706
    assert len(net.buffer_shapes()) == 12


# -- version-1 nets unchanged ------------------------------------------------------------------

ALEXNET = ["conv1", "relu1", "maxpool1", "conv2", "relu2", "maxpool2", "conv3", "relu3", "conv4",
           "relu4", "conv5", "relu5", "maxpool3", "flatten1", "dropout1", "fc6", "relu6",
           "dropout2", "fc7", "relu7", "fc8"]
VGG16 = ["conv1", "relu1", "conv2", "relu2", "maxpool1", "conv3", "relu3", "conv4", "relu4",
         "maxpool2", "conv5", "relu5", "conv6", "relu6", "conv7", "relu7", "maxpool3", "conv8",
         "relu8", "conv9", "relu9", "conv10", "relu10", "maxpool4", "conv11", "relu11", "conv12",
         "relu12", "conv13", "relu13", "maxpool5", "flatten1", "fc6", "relu14", "dropout1",
         "fc7", "relu15", "dropout2", "fc8"]
SMALLCNN = ["conv1", "relu1", "conv2", "relu2", "maxpool1", "flatten1", "dropout1", "linear1",
            "relu3", "linear2"]
MLP = ["linear1", "relu1", "linear2", "relu2", "dropout1", "linear3"]


@pytest.mark.parametrize("name,names,count", [("alexnet", ALEXNET, 61_100_840),
                                              ("vgg16", VGG16, 138_357_544),
                                              ("smallcnn", SMALLCNN, 38_282),
                                              ("mlp", MLP, 17_226)])
def test_version_1_nets_are_unchanged(name, names, count):
    """Names and parameter counts as the version-1 parser gave them (commit ef4a957)."""
    net = load_net(name)
    assert [layer.name for layer in net.layers] == names
    assert net.parameter_count() == count
    assert net.is_chain()
    assert net.buffer_shapes() == {}
    assert all(layer.inputs == ((INPUT,) if k == 0 else (net.layers[k - 1].name,))
               for k, layer in enumerate(net.layers))
    assert sum(math.prod(s) for s in net.param_shapes().values()) == count


def test_version_1_shapes_are_unchanged():
    assert load_net("alexnet").with_image_size(127).shapes()[14] == (2304,)
    assert load_net("smallcnn").param_shapes() == {
        "conv1.weight": (16, 1, 3, 3), "conv1.bias": (16,), "conv2.weight": (32, 16, 3, 3),
        "conv2.bias": (32,), "linear1.weight": (64, 512), "linear1.bias": (64,),
        "linear2.weight": (10, 64), "linear2.bias": (10,)}
    square = parse_net("input channels=1 size=8 classes=2\nconv out=2 kernel=3 stride=2 pad=1\n"
                       "maxpool kernel=2\nflatten\nlinear out=2\n", "v1.net")
    assert square.layers[0].options.kernel == (3, 3)
    assert square.layers[0].options.pad == ((1, 1), (1, 1))
    assert square.out_shapes[:2] == ((2, 4, 4), (2, 2, 2))


@pytest.mark.parametrize("key", ["name", "in", "repeat", "block"])
def test_a_block_parameter_may_not_be_a_key_of_use(key):
    with pytest.raises(NetError, match=f"block parameter '{key}' is a key of every 'use'"):
        net_of(f"define b {key}\n  relu\nend\nuse b\n")
