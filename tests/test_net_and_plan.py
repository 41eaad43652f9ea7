"""The .net format, the shipped nets, and grid specs / plan files."""

import pytest

from hpctrain.layout.partition import SplitError
from hpctrain.model.net import NetError, available_nets, load_net, parse_net
from hpctrain.plan.plans import (
    LayerPlan,
    PlanError,
    plan_and_fallbacks,
    plan_from_spec,
    read_plan,
    write_plan,
)


def test_shipped_nets_and_their_sizes():
    assert {"alexnet", "vgg16", "smallcnn", "mlp"} <= set(available_nets())
    assert load_net("alexnet").parameter_count() == 61_100_840
    assert load_net("vgg16").parameter_count() == 138_357_544
    alex = load_net("alexnet")
    assert sum(l.kind == "conv" for l in alex.layers) == 5
    assert sum(l.kind == "linear" for l in alex.layers) == 3
    assert load_net("vgg16").with_image_size(128).shapes()[-1] == (1000,)


def test_image_size_changes_the_flattened_width():
    assert load_net("alexnet").with_image_size(127).shapes()[14] == (2304,)
    with pytest.raises(NetError, match="layer maxpool1 receives 1x1, too small"):
        load_net("alexnet").with_image_size(8)
    with pytest.raises(NetError, match="flat input"):
        load_net("mlp").with_image_size(32)


@pytest.mark.parametrize("text,message", [
    ("conv out=3 kernel=3", "first line must be 'input"),
    ("input channels=1 size=8 classes=2\nconvv out=2", "line 2: unknown layer kind 'convv'"),
    ("input channels=1 size=8 classes=2\nconv out=2", "conv needs kernel"),
    ("input channels=1 size=8 classes=2\nconv out=2 kernel=3 colour=red", "takes no 'colour'"),
    ("input channels=1 size=8 classes=2\nconv out=x kernel=3", "'x' is not a number"),
    ("input channels=1 size=8 classes=2\nflatten\nlinear out=3", "gives shape \\(3,\\)"),
    ("input channels=1 size=8 classes=2\nlinear out=2", "add a 'flatten'"),
    ("input channels=1 size=8 classes=2\ndropout p=1.5", "p=1.5 must be in"),
    ("input channels=1 size=8 classes=2\nconv out=2 kernel=3 stride=0",
     "stride=0 must be a positive"),
    ("input channels=1 size=8 classes=2\nconv out=2 kernel=3 pad=-1", "pad=-1 must be a non"),
    ("input channels=1 size=8 classes=2\nmaxpool kernel=2 pad=2", "hold only padding"),
])
def test_malformed_nets_name_the_problem(text, message):
    with pytest.raises(NetError, match=message):
        parse_net(text, "bad.net")


def test_unknown_net_names_the_shipped_ones_it_may_mean():
    """A typo gets the close names; a name like none of them is told where the list is."""
    with pytest.raises(NetError, match="unknown net 'resnet'.*did you mean resnet"):
        load_net("resnet")
    with pytest.raises(NetError, match=r"unknown net 'xyzzy'.*--help lists the \d+ shipped"):
        load_net("xyzzy")


def test_user_net_file(tmp_path):
    path = tmp_path / "tiny.net"
    path.write_text("input features=4 classes=3  # comment\nlinear out=5 name=hidden\nrelu\n"
                    "linear out=3\n")
    net = load_net(str(path))
    assert [l.name for l in net.layers] == ["hidden", "relu1", "linear2"]  # by position in kind
    assert net.parameter_count() == 4 * 5 + 5 + 5 * 3 + 3


def test_grid_specs():
    net = load_net("alexnet")
    plan = plan_from_spec("2x2", net, 4)
    assert {p.describe() for p in plan} == {"model 2x2", "follow"}
    plan = plan_from_spec("conv=domain:4x1,fc=1x4", net, 4)
    by_name = dict(zip((l.name for l in net.layers), plan, strict=True))
    assert by_name["conv1"] == LayerPlan("domain", (4, 1))
    assert by_name["fc6"].mode == "batch" and by_name["fc6"].grid == (1, 4)
    assert by_name["maxpool1"].mode == "follow"


@pytest.mark.parametrize("spec,message", [
    ("3x3", "grid 3x3 needs 9 processes but 4"), ("2by2", "is not RxC"),
    ("conv=2x2", "no grid for fc layers"), ("conv=2x2,fc=domain:2x2", "cannot be domain-parallel"),
    ("conv=slab:2x2,fc=2x2", "unknown mode 'slab'"), ("auto", "needs the planner"),
    ("nosuchfile.plan", "not RxC"),
])
def test_bad_grid_specs(spec, message):
    with pytest.raises(PlanError, match=message):
        plan_from_spec(spec, load_net("alexnet"), 4)


@pytest.mark.parametrize("spec,message", [
    ("conv=h64,fc=64x1", "--grid conv='h64': layer conv1 cannot take split n=1,c=1,h=64,w=1: "
                         "input height of size 8 cannot be split 64 ways"),
    ("conv=i64,fc=64x1", "--grid conv='i64': layer conv1 cannot take split "
                         "n=1,c=1,i=64,h=1,w=1: input channels of size 1 cannot be split 64 ways"),
    ("conv=1x64,fc=c64", "--grid fc='c64': layer linear2 cannot take split n=1,c=64: output "
                         "features of size 10 cannot be split 64 ways"),
])
def test_a_split_by_axes_that_cannot_be_made_is_refused_not_replaced(spec, message):
    """The refusal names the split asked, the axis, its size and the degree, not the mode
    (model 64x1, replicated 64x1) a 1.5D spec falls back to; it says how to ask for that."""
    with pytest.raises(SplitError) as err:
        plan_from_spec(spec, load_net("smallcnn"), 64)
    assert str(err.value).startswith(message)
    assert "64x1" not in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).endswith("after the degrees to run model where they do not fit"
                                   if "conv=" in message else
                                   "after the degrees to run replicated where they do not fit")


def test_a_split_by_axes_falls_back_only_where_asked_and_says_so():
    net = load_net("smallcnn")
    plan, fell_back = plan_and_fallbacks("conv=i2/model,fc=2x1", net, 2)
    assert fell_back == ["layer conv1 runs model 2x1, not split n=1,c=1,i=2,h=1,w=1: input "
                         "channels of size 1 cannot be split 2 ways (a rank would be empty); "
                         "cut it at most 1 way"]
    assert [p.describe() for p in plan if p.mode != "follow"] == [
        "model 2x1", "split n=1,c=1,i=2,h=1,w=1", "model 2x1", "model 2x1"]
    plan, fell_back = plan_and_fallbacks("conv=2x32,fc=c64/replicated", net, 64)
    assert plan[-1] == LayerPlan("replicated", (64, 1)) and len(fell_back) == 1
    assert fell_back[0].startswith("layer linear2 runs replicated 64x1, not split n=1,c=64: ")
    # and where the fallback cannot run either, both are named
    with pytest.raises(SplitError, match="^--grid conv='h64/model': layer conv1 cannot take "
                                         "split n=1,c=1,h=64,w=1 \\(input height of size 8 "
                                         ".*\\) nor its fallback model 64x1 \\(output channels "
                                         "of size 16 cannot be split 64 ways"):
        plan_from_spec("conv=h64/model,fc=64x1", net, 64)
    with pytest.raises(SplitError, match="^--grid conv='domain:64x1': layer conv1 cannot take "
                                         "domain 64x1 \\(.*\\) nor its fallback model 64x1"):
        plan_from_spec("conv=domain:64x1,fc=64x1", net, 64)


@pytest.mark.parametrize("spec,message", [
    ("conv=h-2", "'h-2' is neither a grid nor a split; write RxC \\(e.g. 2x2\\), domain:RxC "
                 "or a degree per axis"),
    ("conv=2by2", "'2by2' is neither a grid nor a split; write RxC \\(e.g. 2x2\\), domain:RxC"),
    ("fc=64x1x", "'64x1x' is neither a grid nor a split; write RxC \\(e.g. 2x2\\), "
                 "replicated:RxC or a degree per axis"),
    ("conv=h2/replicated", "a conv layer that cannot take a split falls back to model only; "
                           "write conv=h2/model, or conv=h2 to refuse it"),
    ("fc=c2/model", "falls back to replicated only; write fc=c2/replicated"),
    ("conv=domain:64x1/model", "only a degree per axis takes /model \\(e.g. conv=h2w2/model\\)"),
])
def test_a_malformed_kind_spec_names_every_form_it_could_be(spec, message):
    with pytest.raises(PlanError, match=message) as err:
        plan_from_spec(spec, load_net("smallcnn"), 64)
    assert str(err.value).startswith(f"--grid {spec.split('=')[0]}='{spec.split('=')[1]}': ")


def test_a_grid_spec_says_which_layers_fell_back_and_why():
    net = load_net("smallcnn")
    plan, fell_back = plan_and_fallbacks("conv=domain:16x1,fc=16x1", net, 16)
    assert fell_back == [
        "layer conv1 runs model 16x1, not domain 16x1: input height of size 8 cannot be split 16 "
        "ways (a rank would be empty); cut it at most 8 ways",
        "layer conv2 runs model 16x1, not domain 16x1: input height of size 8 cannot be split 16 "
        "ways (a rank would be empty); cut it at most 8 ways",
        "layer linear2 runs replicated 16x1, not model 16x1: output features of size 10 cannot "
        "be split 16 ways (a rank would be empty); cut it at most 10 ways"]
    assert plan == plan_from_spec("conv=domain:16x1,fc=16x1", net, 16)
    assert plan_and_fallbacks("16x1", net, 16)[1] == fell_back[2:]
    assert plan_and_fallbacks("conv=domain:4x1,fc=4x1", net, 4)[1] == []


def test_shipped_plan_by_name_and_its_file_by_path():
    net = load_net("smallcnn")
    plan = plan_from_spec("smallcnn-p4-mixed", net, 4)
    assert [p.describe() for p in plan if p.mode != "follow"] == [
        "domain 2x2", "model 2x2", "model 4x1", "batch 1x4"]
    with pytest.raises(PlanError, match=r"shipped plan \(.*smallcnn-p4-mixed"):
        plan_from_spec("smallcnn-p9", net, 4)


def test_plan_file_round_trip_and_errors(tmp_path):
    net = load_net("smallcnn")
    plan = plan_from_spec("conv=domain:2x3,fc=3x2", net, 6)
    path = tmp_path / "p.plan"
    write_plan(path, net, plan, header="made by a test")
    assert read_plan(path, net, 6) == plan
    assert plan_from_spec(str(path), net, 6) == plan
    path.write_text("conv1 model 2x2\n")
    with pytest.raises(PlanError, match="no grid for layer conv2"):
        read_plan(path, net, 4)
    path.write_text("conv9 model 2x2\n")
    with pytest.raises(PlanError, match="'conv9' is not in net"):
        read_plan(path, net, 4)


IMAGE = "input channels=1 size=8 classes=2\n"


@pytest.mark.parametrize("text,message", [
    (IMAGE + "input channels=1 size=8 classes=2", "line 2: a second 'input' line"),
    (IMAGE + "conv out=4 out=8 kernel=3", "'out' is given twice \\('4' and '8'\\)"),
    (IMAGE + "conv out=2 kernel=3 name=a\nconv out=2 kernel=3 name=a", "'a' is used twice"),
    (IMAGE + "conv out=2 kernel=3 name=a/b", "name 'a/b' must be"),
    (IMAGE + "conv out=2.0 kernel=3", "out='2.0' must be a whole number"),
    (IMAGE + "conv out=1e400 kernel=3", "out='1e400' must be a whole number"),
    (IMAGE + "conv out=" + "9" * 5000 + " kernel=3", "larger than any size can be"),
    (IMAGE + "conv out=٣ kernel=3", "out='٣' must be a whole number written with digits"),
    (IMAGE + "dropout p=nan", "p='nan' must be a finite number"),
    (IMAGE + "conv out=2 kernel=3 bias=2", "bias=2 must be 0 or 1"),
    ("input channels=1 size=8 classes=2.5\nflatten", "classes='2.5' must be a whole number"),
    ("input channels=1 size=inf classes=2\nflatten", "size='inf' must be a whole number"),
    ("input channels=1 size=8 classes=2 colour=3\nflatten", "input takes no 'colour'"),
    ("input features=4 channels=1 classes=2\nflatten", "features=… takes no channels"),
    ("input channels=1 size=8 height=4 classes=2\nflatten", "size=… or height=… width=…"),
    ("input channels=1 classes=2\nflatten", "input needs size="),
    ("input features=0 classes=2\nflatten", "input sizes must be positive"),
    ("input features=9223372036854775807 classes=2\nlinear out=2",
     "layer linear1's weight has shape \\(2, 9223372036854775807\\), 1.84e\\+19 elements"),
    ("input channels=3037000500 size=3037000500 classes=2\nflatten", "gives shape"),
    ("input features=4 classes=2\nlinear out=2 name=", "expected key=value, got 'name='"),
    ("x" * 10_000_000, "got 'xxx.*… \\(10,000,000 characters\\)$"),
])
def test_net_files_refuse_anything_odd_in_one_line(text, message):
    with pytest.raises(NetError, match=message) as err:
        parse_net(text, "bad.net")
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize("text,message", [
    ("conv1 model 2x2\nconv1 model 2x2\n", "line 2: layer 'conv1' is given twice"),
    ("conv9 model 2x2\n", "line 1: layer 'conv9' is not in net smallcnn"),
    ("conv1 model 2x2 extra\n", "expected 'NAME MODE RxC'.*got 'conv1 model 2x2 extra'"),
    ("relu1 follow 2x2\n", "or 'NAME follow', got 'relu1 follow 2x2'"),
    ("conv1 batch 2x2\n", "mode batch splits only the batch, so its grid is 1x4"),
    ("conv1 model " + "9" * 5000 + "x1\n", "needs far more than the 4 processes"),
    ("conv1 model ２x２\n", "is not a grid"),
])
def test_plan_files_refuse_anything_odd_in_one_line(tmp_path, text, message):
    path = tmp_path / "p.plan"
    path.write_text(text)
    with pytest.raises(PlanError, match=message) as err:
        read_plan(path, load_net("smallcnn"), 4)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize("spec,message", [
    ("conv=2x2,conv=1x4", "gives conv= twice"), ("fc=2x2,conv=2x2,fc=4x1", "gives fc= twice"),
    ("9" * 5000 + "x1", "needs far more than"), ("a" * 100_000, "… \\(100,000 characters\\)"),
    ("bad\0name", "'bad\\\\x00name' is not RxC"),
])
def test_grid_specs_refuse_anything_odd_in_one_line(spec, message):
    with pytest.raises(PlanError, match=message) as err:
        plan_from_spec(spec, load_net("alexnet"), 4)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300
