"""Segmentation on one process: the per-pixel softmax cross-entropy, its gradient and class
weights against PyTorch's ``F.cross_entropy``; pixel accuracy and mean IoU against NumPy; how a
net says it segments; the loss row the planner prices; datasets of label maps (convert, its
refusals, reading a block); and flips and crops applied alike to an image and its label map.
(Plans on several ranks against one process: ``tests/mpi/test_segmentation.py``.)
"""

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.cli import main
from hpctrain.comm.grid import GridSet
from hpctrain.commands.convert import run as convert
from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import local_profile
from hpctrain.data.augment import Augmented
from hpctrain.data.dataset_format import DatasetError, inspect_dataset
from hpctrain.data.dataset_reader import H5Data
from hpctrain.data.dataset_writer import write_dataset
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import make_backend
from hpctrain.kernels.segmentation import PixelTotals, class_counts, pixel_cross_entropy
from hpctrain.layout.layout import Layout
from hpctrain.model.net import NetError, load_net, parse_net
from hpctrain.plan.placement import loss_layout
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel
from hpctrain.run.network import Network

SEGMENT_TEXT = """
input channels=2 height=9 width=7 classes=3
conv out=4 kernel=3 pad=1
relu
conv name=head out=3 kernel=1
"""
SEGMENT = parse_net(SEGMENT_TEXT, "segment")


def random_case(shape, classes, seed=0):
    """Logits (n, K, *S) and labels (n, *S) with about one pixel in five labelled −1."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(shape[0], classes, *shape[1:])) * 2
    labels = rng.integers(-1, classes, size=shape)
    labels[rng.random(shape) < 0.1] = -1
    return logits, labels


@pytest.mark.reference
@pytest.mark.parametrize("shape", [(3, 5, 6), (2, 3, 4, 5)])
@pytest.mark.parametrize("weights", [None, (1.0, 2.5, 0.0, 0.5)])
def test_pixel_loss_and_gradient_equal_pytorchs(shape, weights):
    """Σ w CE / Σ w over the counted pixels, and its gradient, as
    ``F.cross_entropy(weight=w, ignore_index=-1)`` (reduction mean), images and volumes."""
    torch = pytest.importorskip("torch")
    logits, labels = random_case(shape, 4)
    loss_sum, weight_sum, correct, counted, grad = pixel_cross_entropy(np, logits, labels,
                                                                       weights)
    z = torch.tensor(logits, requires_grad=True)
    w = None if weights is None else torch.tensor(weights, dtype=torch.float64)
    want = torch.nn.functional.cross_entropy(z, torch.tensor(labels), weight=w,
                                             ignore_index=-1)
    want.backward()
    assert loss_sum / weight_sum == pytest.approx(want.item(), rel=1e-12)
    np.testing.assert_allclose(grad / weight_sum, z.grad.numpy(), rtol=1e-10, atol=1e-15)
    counted_mask = labels >= 0
    assert counted == counted_mask.sum()
    assert correct == ((logits.argmax(axis=1) == labels) & counted_mask).sum()
    assert not grad.transpose(1, 0, *range(2, len(shape) + 1))[:, ~counted_mask].any()


def test_mean_iou_and_pixel_accuracy_equal_a_direct_count():
    """Per class |pred = c ∧ label = c| and |pred = c ∨ label = c| over the counted pixels,
    summed over two batches before dividing; the mean over classes with a union."""
    classes = 5
    found = PixelTotals(classes)
    every_prediction, every_label = [], []
    for seed in (1, 2):
        logits, labels = random_case((4, 6, 7), classes, seed)
        labels[labels == 4] = 0  # class 4 never a label: its union is its predictions alone
        logits[:, 3] = -100.0  # class 3 never predicted
        labels[labels == 3] = 1  # nor a label: not present, left out of the mean
        both, union = class_counts(np, logits, labels)
        loss_sum, weight_sum, correct, counted, _ = pixel_cross_entropy(np, logits, labels)
        found.add(PixelTotals(classes, float(loss_sum), float(weight_sum), int(correct),
                              int(counted), both, union))
        every_prediction.append(logits.argmax(axis=1).ravel())
        every_label.append(labels.ravel())
    predicted, label = np.concatenate(every_prediction), np.concatenate(every_label)
    keep = label >= 0
    predicted, label = predicted[keep], label[keep]
    ious = []
    for c in range(classes):
        union = ((predicted == c) | (label == c)).sum()
        if union:
            ious.append(((predicted == c) & (label == c)).sum() / union)
    assert found.union[3] == 0 and len(ious) == classes - 1
    assert found.mean_iou == pytest.approx(np.mean(ious), rel=1e-12)
    assert found.accuracy == pytest.approx((predicted == label).mean(), rel=1e-12)
    again = PixelTotals.of_vector(classes, found.vector())
    assert again.mean_iou == found.mean_iou and again.counted == found.counted


def test_a_net_segments_when_its_last_layer_gives_classes_at_the_input_size():
    assert SEGMENT.per_pixel and SEGMENT.out_shapes[-1] == (3, 9, 7)
    assert SEGMENT.loss.per_pixel and SEGMENT.loss.name == "pixel-softmax"
    assert not load_net("resdigits").per_pixel  # a classifier is as it was
    assert load_net("resdigits").loss.name == "softmax"
    bigger = SEGMENT.with_image_size(16)
    assert bigger.per_pixel and bigger.out_shapes[-1] == (3, 16, 16)
    weighted = SEGMENT.with_class_weights((1.0, 2.0, 0.5))
    assert weighted.loss.weights == (1.0, 2.0, 0.5) and weighted == SEGMENT


@pytest.mark.parametrize("text, fragment", [
    ("input channels=2 size=8 classes=3\nconv out=3 kernel=3",
     "gives shape (3, 6, 6) but the loss needs (3,) (classes=3), or (3, 8, 8) for a class"),
    ("input channels=2 size=8 targets=3\nconv out=3 kernel=3 pad=1",
     "gives shape (3, 8, 8) but the loss needs (3,) (targets=3)"),
])
def test_a_last_layer_of_neither_shape_is_refused(text, fragment):
    with pytest.raises(NetError) as err:
        parse_net(text, "bad")
    assert fragment in str(err.value)


@pytest.mark.parametrize("weights, fragment", [
    ((1.0, 2.0), "gives 2 weights but net segment has 3 classes"),
    ((0.0, 0.0, 0.0), "not all 0"),
])
def test_class_weights_that_do_not_fit_are_refused(weights, fragment):
    with pytest.raises(NetError) as err:
        SEGMENT.with_class_weights(weights)
    assert fragment in str(err.value)
    with pytest.raises(NetError, match="applies to a segmentation net"):
        load_net("resdigits").with_class_weights((1.0,) * 10)


def test_the_loss_keeps_a_domain_splits_rows_and_is_priced_by_its_pixels():
    """The loss layout of a height split keeps the rows cut (only the classes gather); the
    loss row of a segmentation is compute that grows with each rank's pixels, and a
    classifier's loss row is what it was (no compute)."""
    last = Layout((8, 3, 9, 7), mesh=(2, 2, 2), axes=(0, 2, 1))  # N/2, H/2, K/2
    kept = loss_layout(SEGMENT, last)
    assert kept.parts == (2, 1, 2, 1) and kept.replicas == 2
    classifier = load_net("resdigits", 8)
    flat = Layout((8, 10), (2, 2), 1)
    assert loss_layout(classifier, flat) == flat.replicated()

    def loss_row(net, procs, mode):
        model = CostModel(net, 8, procs, local_profile(), FlopModel(1e9))
        layouts = model.runnable_layouts(len(model.heads) - 1, LayerPlan(mode, (procs, 1)))
        return model.loss_cost(layouts[-1].output)

    one, four = loss_row(SEGMENT, 1, "batch"), loss_row(SEGMENT, 4, "domain")
    assert one.work is not None and sum(one.compute) > 0
    assert sum(four.compute) == pytest.approx(sum(one.compute) * 3 / 9)  # 3 of 9 rows
    assert loss_row(classifier, 1, "batch").compute == (0.0, 0.0)
    assert loss_row(classifier, 1, "batch").work is None


def test_one_process_loss_and_accuracy_are_the_kernels():
    """Network.loss of a whole batch on one process: the weighted mean and pixel accuracy."""
    backend = make_backend("cpu", "float64", MPI.COMM_SELF)
    net = SEGMENT.with_class_weights((1.0, 3.0, 0.5))
    logits, labels = random_case((5, 9, 7), 3, seed=4)
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, [LayerPlan("batch", (1, 1)), LayerPlan("follow"),
                                LayerPlan("batch", (1, 1))], 5, grids, backend)
        loss, accuracy, grad = network.loss(logits, labels)
    loss_sum, weight_sum, correct, counted, want = pixel_cross_entropy(np, logits, labels,
                                                                       net.loss.weights)
    assert loss == pytest.approx(loss_sum / weight_sum, rel=1e-12)
    assert accuracy == pytest.approx(correct / counted, rel=1e-12)
    np.testing.assert_allclose(grad, want / weight_sum, rtol=1e-12)


def _arrays(tmp_path, n=6, size=(5, 4), classes=3):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(n, 2, *size)).astype(np.float32)
    maps = rng.integers(0, classes, size=(n, *size))
    maps[0, 0, 0] = 255
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", maps)
    return images, maps


def test_convert_writes_label_maps_and_a_rank_reads_its_block(tmp_path):
    images, maps = _arrays(tmp_path)
    out = tmp_path / "d.h5"
    assert main(["convert", "--images", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "--ignore", "255", "--out", str(out)]) == 0
    info = inspect_dataset(out)
    assert info.label_maps and info.classes == 3 and info.sample_shape == (2, 5, 4)
    with h5py.File(out) as h5:
        stored = h5["train/labels"][()]
    want = np.where(maps == 255, -1, maps)
    np.testing.assert_array_equal(stored, want)
    backend = make_backend("cpu", "float32", MPI.COMM_SELF)
    with H5Data(backend, out, 4, split="train", info=info, in_order=True) as data:
        # batch 1 holds samples 4 and 5, then padding: positions 1..3 are sample 5 and two
        # padded maps, rows 2..4 and columns 1..2 of each
        block = data.labels(1, ((1, 4), (2, 5), (1, 3)))
        assert block.shape == (3, 3, 2)
        np.testing.assert_array_equal(block[0], want[5, 2:5, 1:3])
        assert (block[1:] == -1).all()


@pytest.mark.parametrize("labels, fragment", [
    (lambda maps: maps[:, :3], "train label maps have shape 6x3x4 but the train images "
                               "6x2x5x4; give one 5x4 label map per image"),
    (lambda maps: maps[:5], "train label maps have shape 5x5x4 but the train images"),
    (lambda maps: np.where(maps == 255, 7, maps), "train label 7 is outside [0, 3)"),
    (lambda maps: np.where(maps == 255, -2, maps), "train label -2 is negative"),
])
def test_convert_refuses_label_maps_that_do_not_fit(tmp_path, labels, fragment):
    images, maps = _arrays(tmp_path)
    np.save(tmp_path / "bad.npy", labels(maps))
    with pytest.raises(DatasetError) as err:
        convert(["--images", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "bad.npy"),
                 "--classes", "3", "--out", str(tmp_path / "e.h5")])
    assert fragment in str(err.value)
    assert not (tmp_path / "e.h5").exists()


def test_a_dataset_of_label_maps_fits_only_a_segmentation_net(tmp_path):
    from hpctrain.data.dataset_fit import check_label_maps

    images, maps = _arrays(tmp_path)
    write_dataset(tmp_path / "m.h5", images, maps[:, :, :] % 3, 3)
    write_dataset(tmp_path / "l.h5", images, np.arange(6) % 3, 3)
    check_label_maps(inspect_dataset(tmp_path / "m.h5"), True, "segment")
    with pytest.raises(DatasetError, match="holds label maps .* gives one score per sample"):
        check_label_maps(inspect_dataset(tmp_path / "m.h5"), False, "resdigits")
    with pytest.raises(DatasetError, match="scores every pixel .* one label per sample"):
        check_label_maps(inspect_dataset(tmp_path / "l.h5"), True, "segment")


class _Numbered:
    """Images whose channel 0 is each pixel's number h·W + w and label maps of that number,
    so an augmented label must equal the augmented image's value at its pixel."""

    split, backend = "train", make_backend("cpu", "float64", MPI.COMM_SELF)
    nonfinite = None

    def __init__(self, n, height, width):
        self.sample_shape, self.batch = (2, height, width), n
        numbers = np.arange(height * width, dtype=np.int64).reshape(height, width)
        self.maps = np.broadcast_to(numbers, (n, height, width)) + 100 * np.arange(n)[:, None,
                                                                                       None]
        self.pictures = np.stack([self.maps, -self.maps], axis=1).astype(np.float64)

    def images(self, step, box):
        return self.pictures[tuple(slice(a, b) for a, b in box)].copy()

    def labels(self, step, box):
        return self.maps[tuple(slice(a, b) for a, b in box)].copy()


@pytest.mark.parametrize("mode", ["flip", "crop", "standard"])
def test_flips_and_crops_move_an_image_and_its_label_map_alike(mode):
    """Every block of the augmented maps holds the label of the augmented image's pixel at
    the same place (its number), −1 where the image is padding; and the flipped samples
    are flipped in both."""
    source = _Numbered(8, 7, 6)
    augmented = Augmented(source, mode, seed=3, pad=2)
    whole = ((0, 8), (0, 2), (0, 7), (0, 6))
    image = augmented.images(0, whole)[:, 0]
    maps = augmented.labels(0, (whole[0], *whole[2:]))
    padding = maps == -1
    np.testing.assert_array_equal(maps[~padding], image[~padding].astype(np.int64))
    assert (image[padding] == 0).all()
    for rows, columns in [((0, 4), (0, 6)), ((4, 7), (1, 5)), ((2, 5), (3, 6))]:
        block = augmented.labels(0, ((2, 7), rows, columns))
        np.testing.assert_array_equal(block, maps[2:7, slice(*rows), slice(*columns)])
    flipped = augmented.draws(0, (0, 8))[0]
    if mode != "crop":  # a flipped sample's row of pixel numbers runs backwards
        assert flipped.any()
        row = maps[int(np.flatnonzero(flipped)[0]), 3]
        assert (np.diff(row[row >= 0]) < 0).all()


def test_synthetic_label_maps_are_the_same_block_by_block():
    backend = make_backend("cpu", "float64", MPI.COMM_SELF)
    data = SyntheticData.for_net(backend, SEGMENT, 6, seed=2)
    whole = data.labels(1, ((0, 6), (0, 9), (0, 7)))
    assert whole.shape == (6, 9, 7) and whole.min() >= 0 and whole.max() < 3
    np.testing.assert_array_equal(data.labels(1, ((2, 5), (3, 8), (1, 4))),
                                  whole[2:5, 3:8, 1:4])


def test_training_logs_pixel_accuracy_and_mean_iou(tmp_path, capsys):
    """A segmentation run on a dataset of label maps, flipped: the progress line and the run
    log carry the held-out pixel accuracy and mean IoU, and predict writes scores per pixel
    and the label maps they give, with the same metrics."""
    _arrays(tmp_path, n=12, size=(6, 6))
    (tmp_path / "seg.net").write_text(SEGMENT_TEXT.replace("height=9 width=7", "size=6"))
    data, log = tmp_path / "d.h5", tmp_path / "run.h5"
    assert main(["convert", "--images", str(tmp_path / "x.npy"), "--labels",
                 str(tmp_path / "y.npy"), "--ignore", "255", "--val-fraction", "0.25",
                 "--out", str(data)]) == 0
    assert main(["--net", str(tmp_path / "seg.net"), "--data", str(data), "--batch", "3",
                 "--steps", "2", "--augment", "flip", "--class-weights", "1,2,1",
                 "--machine", "default", "--compute", "flops", "--log", str(log),
                 "--checkpoint-dir",
                 str(tmp_path / "ck")]) == 0
    printed = capsys.readouterr().out
    line = next(text for text in printed.splitlines() if text.startswith("validation"))
    assert "pixel accuracy" in line and "mean IoU" in line
    with h5py.File(log) as h5:
        assert h5["validation/mean_iou"].shape == (1,)
        assert 0 < h5["validation/mean_iou"][0] <= 1
        iou, accuracy = h5["validation/mean_iou"][0], h5["validation/accuracy"][0]
    out = tmp_path / "p.h5"
    assert main(["predict", "--checkpoint", str(tmp_path / "ck"), "--data", str(data),
                 "--out", str(out), "--batch", "2", "--machine", "default", "--compute",
                 "flops"]) == 0
    with h5py.File(out) as h5:
        assert h5["outputs"].shape == (3, 3, 6, 6) and h5["label_maps"].shape == (3, 6, 6)
        np.testing.assert_array_equal(h5["label_maps"][()], h5["outputs"][()].argmax(axis=1))
        assert h5.attrs["mean_iou"] == pytest.approx(iou, rel=1e-5)
        assert h5.attrs["accuracy"] == pytest.approx(accuracy, rel=1e-6)


# -- synthetic climate fields (convert --climate) ---------------------------------------------


def test_climate_fields_are_seeded_and_hold_every_class(tmp_path):
    """The same seed gives the same samples, one at a time or as a set; the features show in
    the fields (a cyclone's pixels have low pressure, a river's high moisture); ``convert``
    writes them with their label maps, the last fifth held out."""
    from hpctrain.data.climate import climate_sample, climate_set

    images, labels = climate_set(12, 16, 48, 48, seed=3)
    again, _ = climate_sample(3, 7, 16, 48, 48)
    assert np.array_equal(images[7], again)
    assert set(np.unique(labels)) == {0, 1, 2}
    background, river, cyclone = (labels == 0), (labels == 1), (labels == 2)
    moisture, pressure = images[:, :5].mean(axis=1), images[:, 5:10].mean(axis=1)
    assert moisture[river].mean() > moisture[background].mean() + 0.5
    assert pressure[cyclone].mean() < pressure[background].mean() - 0.5
    out = tmp_path / "climate.h5"
    assert convert(["--climate", "10", "--size", "32", "--out", str(out)]) == 0
    info = inspect_dataset(out)
    assert (info.train_size, info.val_size, info.classes) == (8, 2, 3) and info.label_maps
    with h5py.File(out) as f:
        assert f["train/labels"].shape == (8, 32, 32)


@pytest.mark.parametrize("argv,fragment", [
    (["--climate", "1"], "give at least 2 samples"),
    (["--climate", "4", "--size", "4"], "--size 4: --climate's fields are 8 to 2048 a side"),
    (["--climate", "4", "--channels", "2"], "at least 3 fields"),
    (["--climate", "4", "--targets-count", "2"], "--targets-count applies only to --universe"),
    (["--climate", "4", "--labels", "y.npy"], "does not apply to --climate"),
])
def test_a_bad_climate_set_is_refused(tmp_path, argv, fragment):
    with pytest.raises(DatasetError) as caught:
        convert([*argv, "--out", str(tmp_path / "c.h5")])
    assert not (tmp_path / "c.h5").exists()
    assert fragment in str(caught.value)
