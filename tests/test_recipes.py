"""Label smoothing and gradient accumulation on one process: the losses against PyTorch's
``CrossEntropyLoss(label_smoothing=S)`` (with class weights and ``ignore_index`` per pixel),
three float64 steps of accumulated micro-batches against PyTorch accumulating the same way, the
micro-batches' samples, and the refusals of the flags. (Plans on several ranks against one
process: ``tests/mpi/test_recipes.py``.)"""

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.cli import main
from hpctrain.data.source import MicroBatches
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import make_backend
from hpctrain.kernels.loss import softmax_cross_entropy
from hpctrain.kernels.segmentation import pixel_cross_entropy
from hpctrain.model.net import NetError, load_net
from hpctrain.plan.plans import plan_from_spec

torch = pytest.importorskip("torch")

from tests.recipes_reference import (  # noqa: E402
    CASES,
    TOLERANCE,
    hpctrain_accumulating,
    torch_accumulating,
)
from tests.torch_reference import compare, failures  # noqa: E402


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
def test_smoothed_cross_entropy_is_pytorchs(smoothing):
    rng = np.random.default_rng(1)
    z, labels = rng.normal(size=(7, 5)) * 3, rng.integers(0, 5, size=7)
    loss_sum, correct, grad = softmax_cross_entropy(np, z, labels, 0.5, smoothing)
    logits = torch.tensor(z, requires_grad=True)
    want = torch.nn.CrossEntropyLoss(reduction="sum", label_smoothing=smoothing)(
        logits, torch.tensor(labels))
    (want * 0.5).backward()
    assert loss_sum == pytest.approx(want.item(), rel=1e-12)
    np.testing.assert_allclose(grad, logits.grad.numpy(), rtol=1e-11, atol=1e-15)
    assert correct == (z.argmax(1) == labels).sum()


@pytest.mark.parametrize("weights", [None, (1.0, 2.5, 0.0, 0.5)])
@pytest.mark.parametrize("smoothing", [0.1, 0.7])
def test_smoothed_pixel_loss_is_pytorchs_with_weights_and_ignored_pixels(weights, smoothing):
    """Σ over counted pixels over Σ w_y, as ``F.cross_entropy(weight=w, ignore_index=-1,
    label_smoothing=S)``, images and volumes."""
    rng = np.random.default_rng(2)
    for shape in ((3, 5, 6), (2, 3, 4, 5)):
        logits = rng.normal(size=(shape[0], 4, *shape[1:])) * 2
        labels = rng.integers(-1, 4, size=shape)
        loss_sum, weight_sum, _, counted, grad = pixel_cross_entropy(np, logits, labels,
                                                                     weights, smoothing)
        z = torch.tensor(logits, requires_grad=True)
        w = None if weights is None else torch.tensor(weights, dtype=torch.float64)
        want = torch.nn.functional.cross_entropy(z, torch.tensor(labels), weight=w,
                                                 ignore_index=-1, label_smoothing=smoothing)
        want.backward()
        assert loss_sum / weight_sum == pytest.approx(want.item(), rel=1e-12)
        np.testing.assert_allclose(grad / weight_sum, z.grad.numpy(), rtol=1e-10, atol=1e-15)
        assert counted == (labels >= 0).sum()


@pytest.mark.parametrize("case, accumulate, smoothing", [
    ("bn_cnn", 2, 0.0), ("bn_cnn", 4, 0.1), ("bn_cnn", 1, 0.2), ("segment", 3, 0.15),
])
def test_accumulation_and_smoothing_equal_pytorch(case, accumulate, smoothing):
    """Three float64 steps, each of K micro-batches (batch norm with each micro-batch's
    statistics), against PyTorch's (loss / K).backward() per micro-batch and one SGD step:
    logits, loss, every gradient, every weight and running statistic."""
    make_net, make_model, make_names, weights = CASES[case]
    net = make_net().with_class_weights(weights)
    batch = 12
    plan = plan_from_spec("1x1", net, 1)
    run = hpctrain_accumulating(net, plan, MPI.COMM_SELF, batch, accumulate, smoothing)
    want = torch_accumulating(make_model(), make_names(), run, accumulate, smoothing, weights)
    errors = compare(run.steps, want)
    assert not failures(errors, TOLERANCE), failures(errors, TOLERANCE)
    if accumulate > 1:  # the comparison tells accumulating from one whole batch
        whole = torch_accumulating(make_model(), make_names(), run, 1, smoothing, weights)
        worst = max(compare(run.steps, whole).values())
        assert worst > 1e3 * TOLERANCE, worst


def test_micro_batches_are_the_whole_batchs_samples_in_order():
    backend = make_backend("cpu", "float64", MPI.COMM_SELF)
    source = SyntheticData(backend, (1, 3, 3), classes=4, batch=6)
    micro = MicroBatches(source, 3, 2)
    box = ((0, 2), (0, 1), (0, 3), (0, 3))
    for step in range(2):
        images = np.concatenate([micro.images(step * 3 + j, box) for j in range(3)])
        labels = np.concatenate([micro.labels(step * 3 + j, (0, 2)) for j in range(3)])
        np.testing.assert_array_equal(images, source.images(step, ((0, 6), *box[1:])))
        np.testing.assert_array_equal(labels, source.labels(step, (0, 6)))
    np.testing.assert_array_equal(micro.labels(4, (1, 2)), source.labels(1, (3, 4)))


def test_label_smoothing_refusals():
    net = load_net("smallcnn")
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(NetError, match=f"--label-smoothing {bad} must be from 0 to 1"):
            net.with_label_smoothing(bad)
    regression = load_net("cosmoflow")
    with pytest.raises(NetError, match="--label-smoothing 0.1 smooths a cross-entropy"):
        regression.with_label_smoothing(0.1)
    assert net.with_label_smoothing(0.1) == net  # how it is trained, not what the net is
    assert net.with_label_smoothing(0.1).loss.smoothing == 0.1


@pytest.mark.parametrize("flags, fragment", [
    (["--accumulate", "3", "--batch", "8"], "--accumulate 3 must divide --batch 8 into equal"),
    (["--accumulate", "0"], "--accumulate 0 must be at least 1"),
    (["--label-smoothing", "2"], "--label-smoothing 2.0 must be from 0 to 1"),
    (["--accumulate", "2", "--grid", "auto", "--replan-after", "2", "--steps", "4",
      "--checkpoint-dir", "ck"], "prediction, which is of one micro-batch under --accumulate 2"),
])
def test_bad_flags_get_one_line(flags, fragment, capsys):
    assert main(["--net", "smallcnn", "--image-size", "8", "--steps", "1", *flags]) == 2
    assert fragment in capsys.readouterr().err


def test_a_run_accumulating_through_the_train_command(tmp_path, capsys):
    """--accumulate on the command line: the micro-batch is planned and the run says so; its
    log, whose steps time two micro-batches each, is refused by a refit."""
    log = tmp_path / "run.h5"
    assert main(["--net", "smallcnn", "--image-size", "8", "--batch", "8", "--steps", "2",
                 "--accumulate", "2", "--label-smoothing", "0.1", "--lr-schedule", "poly",
                 "--warmup-steps", "1", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "batch 8 (2 micro-batches of 4 per step)" in out
    assert "step     2/2" in out
    assert "(2 micro-batches of " in out.split("iteration: predicted")[1]
    assert main(["calibrate", "--from-log", str(log), "--out", str(tmp_path / "p.toml")]) == 2
    err = capsys.readouterr().err
    assert "the run accumulated 2 micro-batches of 4 per step (--accumulate 2)" in err
    assert "refit from a run without --accumulate" in err
    assert not (tmp_path / "p.toml").exists()


# -- --classes ---------------------------------------------------------------------------------

TAIL_NET = """input features=4 classes=4
linear name=a out=4
relu name=b
add in=a,b
"""


def test_classes_change_the_layer_that_gives_them():
    resnet = load_net("resnet18")
    ten = resnet.with_classes(10)
    assert ten.classes == 10 and ten.param_shapes()["fc.weight"] == (10, 512)
    assert ten.param_shapes()["conv1.weight"] == resnet.param_shapes()["conv1.weight"]
    assert resnet.with_classes(None) is resnet and resnet.with_classes(1000) is resnet
    # a segmentation's classes come from the conv before its upsampling
    deeplab = load_net("deeplabv3", 32)
    seven = deeplab.with_classes(7)
    assert seven.per_pixel and seven.out_shapes[-1] == (7, 32, 32)
    assert deeplab.layers[deeplab.head()].name == "classifier.4"
    from hpctrain.model.net_text import net_text

    text = net_text(ten)
    assert text.startswith("input channels=3 size=224x224 classes=10")
    assert "linear name=fc out=10" in text


@pytest.mark.parametrize("net, classes, fragment", [
    ("smallcnn", 1, "--classes 1 must be at least 2"),
    ("smallcnn", -3, "--classes -3 must be at least 2"),
    ("cosmoflow", 10, "--classes 10 sets a classifier's classes; net cosmoflow regresses"),
    (TAIL_NET, 3, "--classes 3: the last layer of net tail, 'add1' (add), has no width"),
])
def test_classes_refusals_name_the_value(net, classes, fragment):
    from hpctrain.model.net import parse_net

    spec = parse_net(net, "tail") if "\n" in net else load_net(net)
    with pytest.raises(NetError) as err:
        spec.with_classes(classes)
    assert fragment in str(err.value)


def pretrained_tensors(net):
    """Small random float32 values for every parameter and buffer of ``net``, as a pretrained
    model's weights would stand in a test."""
    rng = np.random.default_rng(0)
    return {name: rng.normal(size=shape).astype(np.float32) * 0.1
            for name, shape in {**net.param_shapes(), **net.buffer_shapes()}.items()}


def test_fine_tune_with_classes_is_logged_checkpointed_and_resumed(tmp_path, capsys):
    """Pretrained weights of the 10-class smallcnn into a 3-class one, its head fresh; the
    log and the checkpoint keep 3 classes, and a resume without --classes takes them."""
    pytest.importorskip("safetensors")
    import h5py

    from hpctrain.interchange.weights import state_dict, write_safetensors
    from hpctrain.run.checkpoint_file import checkpoint_net

    net = load_net("smallcnn")
    tensors = pretrained_tensors(net)
    weights = tmp_path / "pretrained.safetensors"
    write_safetensors(weights, state_dict(net, tensors), {})
    common = ["--net", "smallcnn", "--batch", "4", "--checkpoint-dir", str(tmp_path / "ck")]
    assert main([*common, "--steps", "1", "--classes", "3", "--init", str(weights),
                 "--init-except", "linear2", "--log", str(tmp_path / "run.h5")]) == 0
    capsys.readouterr()
    with h5py.File(tmp_path / "run.h5") as log:
        assert log.attrs["classes"] == 3
    from hpctrain.record.measured import read_measured_plans

    (measured,) = read_measured_plans(tmp_path / "run.h5")  # as calibrate --from-log reads it
    assert measured.net.classes == 3
    checkpoint = tmp_path / "ck" / "step-00000001.h5"
    assert checkpoint_net(checkpoint).classes == 3
    assert main([*common, "--steps", "2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "--classes 3: the net of" in out and "resumed from" in out
    # without --init-except the head's shapes are refused, naming the layer
    assert main([*common[:4], "--steps", "1", "--classes", "3", "--init", str(weights)]) == 2
    assert "--init-except linear2" in capsys.readouterr().err


# -- accumulation under a memory cap -------------------------------------------------------------

CAPPED = ["--net", "smallcnn", "--image-size", "32", "--batch", "64", "--grid", "auto",
          "--mem-per-rank", "40M", "--compute", "flops", "--plan-only"]


def test_accumulate_auto_plans_the_fewest_micro_batches_that_fit(tmp_path, capsys):
    plan = tmp_path / "p.plan"
    assert main([*CAPPED, "--accumulate", "auto", "--plan-file", str(plan)]) == 0
    out = capsys.readouterr().out
    assert ("--accumulate auto: 4 micro-batches of 16 per step (no plan of the whole batch 64 "
            "fits --mem-per-rank 40 MiB)") in out
    assert "batch 16" in plan.read_text()  # the micro-batch is what is planned


@pytest.mark.parametrize("given", ["1", "2"])
def test_a_cap_refusal_names_the_accumulation_that_fits(tmp_path, capsys, given):
    assert main([*CAPPED, "--accumulate", given, "--plan-file", str(tmp_path / "p.plan")]) == 2
    err = capsys.readouterr().err
    assert "no plan fits in --mem-per-rank = 40 MiB" in err
    assert "--accumulate 4 (16 samples each) fits (--accumulate auto picks it)" in err


def test_plan_accumulating_plans_the_micro_batch_and_counts_its_sums(tmp_path, capsys):
    """``plan --accumulate 4`` prices the plan of batch 16 with the gradients' sums kept: more
    memory than a plain plan of 16, the same plan file batch, and a step of 4 micro-batches."""
    plan = ["plan", "--net", "smallcnn", "--procs", "2", "--compute", "flops", "--grid", "1x2"]
    assert main([*plan, "--batch", "16"]) == 0
    alone = capsys.readouterr().out
    assert main([*plan, "--batch", "64", "--accumulate", "4", "--out",
                 str(tmp_path / "p.plan")]) == 0
    out = capsys.readouterr().out
    assert "batch 64 in 4 micro-batches of 16" in out
    assert "a step of 4 micro-batches: about" in out
    assert "batch 16" in (tmp_path / "p.plan").read_text()

    def peak(text):
        return float(text.split("peak memory ")[1].split(" MiB")[0])

    assert peak(out) > peak(alone)
    assert main([*plan, "--batch", "64", "--accumulate", "3"]) == 2
    assert "--accumulate 3 must divide --batch 64" in capsys.readouterr().err


def test_accumulate_auto_needs_a_cap(capsys):
    assert main(["--net", "smallcnn", "--accumulate", "auto", "--steps", "1"]) == 2
    assert "give --grid auto and --mem-per-rank SIZE" in capsys.readouterr().err
    assert main(["--net", "smallcnn", "--accumulate", "x"]) == 2
    assert "'x' is not a number of micro-batches" in capsys.readouterr().err


TINY_NET = """input channels=1 size=6 classes=3
conv out=4 kernel=3 pad=1
relu
flatten
linear out=3
"""


def test_the_train_command_accumulating_equals_the_whole_batch_without_batch_norm(tmp_path):
    """A net with no batch norm and no dropout: K micro-batches of a dataset, read ahead by
    the prefetching thread and augmented, train as the whole batch does (float64, 1e-12),
    and the held-out split, read in micro-batches, scores the same."""
    import h5py

    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(40, 1, 6, 6)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, size=40))
    data = tmp_path / "d.h5"
    assert main(["convert", "--images", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "--out", str(data), "--val-fraction", "0.25"]) == 0
    (tmp_path / "tiny.net").write_text(TINY_NET)
    logs = {}
    for k in (1, 4):
        logs[k] = tmp_path / f"run{k}.h5"
        assert main(["--net", str(tmp_path / "tiny.net"), "--data", str(data), "--batch", "8",
                     "--epochs", "2", "--accumulate", str(k), "--precision", "fp64",
                     "--augment", "flip", "--lr-schedule", "poly", "--label-smoothing", "0.1",
                     "--log", str(logs[k])]) == 0
    with h5py.File(logs[1]) as whole, h5py.File(logs[4]) as micro:
        assert micro["steps/loss"].shape == whole["steps/loss"].shape == (6,)
        np.testing.assert_allclose(micro["steps/loss"][()], whole["steps/loss"][()], rtol=1e-12)
        np.testing.assert_allclose(micro["validation/loss"][()], whole["validation/loss"][()],
                                   rtol=1e-12)
        np.testing.assert_array_equal(micro["validation/accuracy"][()],
                                      whole["validation/accuracy"][()])
        assert '"accumulate": 4' in micro.attrs["config"]


@pytest.mark.parametrize("precision", ["bf16", "fp64"])
def test_micro_batch_gradients_are_added_wide_and_rounded_once(precision):
    """Under a 16-bit precision each rank adds its micro-batches' gradients in float32 and
    rounds the sum to 16 bits once; in float64 the sum is g₀ + g₁ + g₂ in order."""
    from hpctrain.comm.grid import GridSet
    from hpctrain.model.net import parse_net
    from hpctrain.run.network import Network

    backend = make_backend("cpu", precision, MPI.COMM_SELF)
    net = parse_net(TINY_NET, "tiny")
    plan = plan_from_spec("1x1", net, 1)
    data = MicroBatches(SyntheticData(backend, net.input_shape, net.classes, 12, 3), 3, 4)
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, plan, 4, grids, backend, seed=3)
        network.train_step(data, 0, accumulate=3)
        summed = [np.asarray(p.grad, np.float64) for p in network.params]
        parts = []
        for j in range(3):  # each micro-batch alone, its loss counted 1/3
            network.train_step(data, j, loss_scale=1 / 3)
            parts.append([p.grad.astype(backend.precision.master) for p in network.params])
    narrow = backend.dtype
    in_steps = []  # what adding in 16 bits would give: rounded after each micro-batch
    for k, got in enumerate(summed):
        want = parts[0][k] + parts[1][k] + parts[2][k]
        assert want.dtype == (np.float32 if precision == "bf16" else np.float64)
        want = want.astype(narrow).astype(np.float64)  # rounded once
        np.testing.assert_array_equal(got, want)
        two = (parts[0][k].astype(narrow) + parts[1][k].astype(narrow)).astype(narrow)
        in_steps.append((two + parts[2][k].astype(narrow)).astype(narrow).astype(np.float64))
    if precision == "bf16":  # the test tells the two apart
        assert any(not np.array_equal(a, b) for a, b in zip(summed, in_steps, strict=True))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_memory_model_counts_the_sums_accumulation_keeps(precision):
    """A plan of K > 1 micro-batches keeps, per parameter, the running sum of its gradients in
    the master dtype: exactly the bytes of the arrays a step that accumulates holds, and
    nothing when K = 1."""
    from hpctrain.comm.grid import GridSet
    from hpctrain.device.precision import PRECISIONS
    from hpctrain.model.net import parse_net
    from hpctrain.plan.planner import plan_memory
    from hpctrain.run.network import Network

    net = parse_net(TINY_NET, "tiny")
    plan = plan_from_spec("1x1", net, 1)
    whole = plan_memory(net, plan, 4, 1, PRECISIONS[precision]).memory
    counted = plan_memory(net, plan, 4, 1, PRECISIONS[precision], accumulate=3).memory
    backend = make_backend("cpu", precision, MPI.COMM_SELF)
    data = MicroBatches(SyntheticData(backend, net.input_shape, net.classes, 12, 3), 3, 4)
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, plan, 4, grids, backend, seed=3)
        network.train_step(data, 0, accumulate=3)
        kept = sum(a.nbytes for a in network._accumulated.values())
    master = np.dtype(backend.precision.master).itemsize
    assert kept == sum(int(np.prod(s)) for s in net.param_shapes().values()) * master
    assert counted - whole == kept


def test_gradients_are_handed_to_the_sums_once_per_step():
    """Three micro-batches, one step: each layer's gradients go to the sums over ranks (and the
    optimizer's update) once, after the last micro-batch, as many times as without
    accumulation."""
    from hpctrain.comm.grid import GridSet
    from hpctrain.model.net import parse_net
    from hpctrain.run.network import Network

    backend = make_backend("cpu", "fp64", MPI.COMM_SELF)
    net = parse_net(TINY_NET, "tiny")
    plan = plan_from_spec("1x1", net, 1)
    counts = {}
    for accumulate in (1, 3):
        data = MicroBatches(SyntheticData(backend, net.input_shape, net.classes, 12, 3),
                            accumulate, 12 // accumulate)
        with GridSet(MPI.COMM_SELF) as grids:
            network = Network(net, plan, 12 // accumulate, grids, backend, seed=3)
            sums, added, updated = network.gradient_sums, [], []

            def counted(comm, params, label=0, add=sums.add, added=added):
                added.append(label)
                add(comm, params, label)

            sums.add = counted
            network.train_step(data, 0, accumulate=accumulate, update=updated.extend)
        counts[accumulate] = (added, [p.name for p in updated])
    assert counts[3] == counts[1]
    assert sorted(counts[3][1]) == sorted(p for p in net.param_shapes())


def test_an_onnx_models_own_weights_start_all_but_the_changed_head(tmp_path, capsys):
    """--net model.onnx --classes 3: its initializers start every layer but the head, whose
    weights are drawn from --seed (no --init-except to give without --init)."""
    pytest.importorskip("onnx")
    from hpctrain.interchange.onnx_export import model_proto

    net = load_net("smallcnn")
    tensors = pretrained_tensors(net)
    path = tmp_path / "smallcnn.onnx"
    path.write_bytes(model_proto(net, tensors).SerializeToString())
    assert main(["--net", str(path), "--classes", "3", "--batch", "4", "--steps", "1"]) == 0
    assert "step     1/1" in capsys.readouterr().out
