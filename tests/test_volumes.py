"""Datasets of 3-D volumes with real-valued targets: the format, slab chunks, rank-local reads
of a depth slab, and the converter (one process)."""

import io
import math
import re

import h5py
import numpy as np
import pytest

from hpctrain.commands import convert as convert_command
from hpctrain.data import arrays, dataset_format, dataset_reader, dataset_writer
from hpctrain.data.dataset_fit import check_fits
from hpctrain.data.dataset_format import DatasetError, DatasetInfo, chunk_shape, inspect_dataset
from hpctrain.data.dataset_reader import H5Data
from hpctrain.data.dataset_writer import write_batches, write_dataset
from hpctrain.device.backend import make_backend
from hpctrain.errors import UserError

N, VOLUME, TARGETS, BATCH, SEED = 13, (2, 6, 5, 4), 3, 4, 5


def volumes(n, shape=VOLUME, targets=TARGETS, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, *shape)).astype(np.float32),
            rng.uniform(-1, 1, (n, targets)).astype(np.float32))


@pytest.fixture
def backend():
    return make_backend("cpu", "float64")


@pytest.fixture
def path(tmp_path):
    """A targets dataset of N training volumes of VOLUME and 6 held-out ones."""
    images, targets = volumes(N)
    val_images, val_targets = volumes(6, seed=1)
    out = tmp_path / "v.h5"
    write_dataset(out, images, description="random volumes", targets=targets,
                  val_images=val_images, val_targets=val_targets)
    return out


def whole(path, split="train"):
    with h5py.File(path, "r") as h5:
        return h5[f"{split}/images"][()], h5[f"{split}/targets"][()]


# --- the format ----------------------------------------------------------------------------------


def test_a_targets_dataset_round_trip(path):
    info = inspect_dataset(path)
    assert info == DatasetInfo(path, VOLUME, TARGETS, N, 6, TARGETS)
    assert info.answers == "targets"
    with h5py.File(path, "r") as h5:
        assert h5.attrs["version"] == 2 and h5.attrs["targets"] == TARGETS
        assert "classes" not in h5.attrs and "labels" not in h5["train"]
        assert h5["train/targets"].dtype == np.float32 and h5["train/targets"].shape == (N, 3)
        np.testing.assert_array_equal(h5["train/images"][()], volumes(N)[0])
        np.testing.assert_array_equal(h5["val/targets"][()], volumes(6, seed=1)[1])


def test_one_target_per_sample_may_be_given_flat(tmp_path):
    images, targets = volumes(5)
    write_dataset(tmp_path / "one.h5", images, targets=targets[:, 0].astype(np.float64))
    info = inspect_dataset(tmp_path / "one.h5")
    assert (info.targets, info.classes, info.val_size) == (1, 1, 0)


def test_a_version_1_file_is_still_read(tmp_path):
    with h5py.File(tmp_path / "old.h5", "w") as h5:
        h5.attrs.update({"format": "hpctrain-dataset", "version": 1, "classes": 3})
        h5["train/images"] = np.zeros((4, 1, 2, 2), np.float32)
        h5["train/labels"] = np.array([0, 1, 2, 1])
    assert inspect_dataset(tmp_path / "old.h5") == DatasetInfo(tmp_path / "old.h5", (1, 2, 2), 3,
                                                               4, 0)


@pytest.mark.parametrize("change,message", [
    (lambda a: {**a, "targets": np.where(a["targets"] > 0.9, np.nan, a["targets"])},
     "train targets of sample 2 hold NaN or infinite values"),
    (lambda a: {**a, "targets": a["targets"].astype(np.float64) * 1e300}, "beyond float32"),
    (lambda a: {**a, "targets": a["targets"][:-1]}, "targets have shape (12, 3) but there are 13"),
    (lambda a: {**a, "targets": np.zeros((N, 2, 2))}, "give one row of targets, (N, T),"),
    (lambda a: {**a, "labels": np.zeros(N, np.int64)}, "give labels or targets, not both"),
    (lambda a: {"images": a["images"]}, "give labels (class indices) or targets (real values)"),
    (lambda a: {**a, "val_images": a["images"], "val_labels": np.zeros(N, np.int64)},
     "val_labels does not go with targets; give val_targets"),
    (lambda a: {**a, "val_images": a["images"]}, "give both val_images and val_targets"),
    (lambda a: {**a, "val_images": a["images"], "val_targets": a["targets"][:, :2]},
     "train samples have 3 targets but val samples 2"),
    (lambda a: {**a, "images": a["images"][:, :, :, :, :, None]}, "(N, C, D, H, W) volumes"),
])
def test_write_refuses_bad_targets(tmp_path, change, message):
    images, targets = volumes(N)
    targets = np.clip(targets, -0.8, 0.8)
    targets[2, 1] = 0.95  # the one value the first case makes NaN
    with pytest.raises(DatasetError, match=re.escape(message)):
        write_dataset(tmp_path / "bad.h5", **change({"images": images, "targets": targets}))
    assert not (tmp_path / "bad.h5").exists()


def test_write_batches_streams_and_refuses_splits_not_filled(tmp_path):
    images, targets = volumes(7)

    def batches(stop=7):
        for lo in range(0, stop, 3):
            yield "train", images[lo:min(lo + 3, stop)], targets[lo:min(lo + 3, stop)]

    write_batches(tmp_path / "s.h5", VOLUME, {"train": 7}, batches(), targets=TARGETS)
    np.testing.assert_array_equal(whole(tmp_path / "s.h5")[0], images)
    with pytest.raises(DatasetError, match="the train batches hold 5 samples, not 7"):
        write_batches(tmp_path / "short.h5", VOLUME, {"train": 7}, batches(5), targets=TARGETS)
    with pytest.raises(DatasetError, match="the train batches hold more than 6 samples"):
        write_batches(tmp_path / "long.h5", VOLUME, {"train": 6}, batches(), targets=TARGETS)
    with pytest.raises(DatasetError, match="train images hold NaN .* first in sample 4"):
        bad = images.copy()
        bad[4, 1, 2, 3, 0] = np.inf
        write_batches(tmp_path / "inf.h5", VOLUME, {"train": 7}, [("train", bad, targets)],
                      targets=TARGETS)
    with pytest.raises(DatasetError, match="train label 3 is outside 0..2"):
        write_batches(tmp_path / "l.h5", VOLUME, {"train": 2}, [("train", images[:2], [0, 3])],
                      classes=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]


def raw_file(path, attrs, **datasets):
    with h5py.File(path, "w") as h5:
        h5.attrs.update({"format": "hpctrain-dataset", "version": 2, **attrs})
        for name, value in datasets.items():
            h5[name.replace("_", "/")] = value


X = np.zeros((2, 1, 2, 2, 2), np.float32)


@pytest.mark.parametrize("attrs,datasets,message", [
    ({"targets": 2}, {"train_images": X, "train_labels": [0, 1]}, "lacks /train/targets"),
    ({"targets": 2}, {"train_images": X, "train_targets": np.zeros((2, 2)),
                      "train_labels": [0, 1]}, "holds /train/labels but has a targets attribute"),
    ({"classes": 2}, {"train_images": X, "train_labels": [0, 1],
                      "train_targets": np.zeros((2, 2))}, "holds /train/targets but has no "
                                                          "targets attribute"),
    ({"targets": 0}, {}, "has targets attribute 0; it must be a positive integer"),
    ({"targets": 2}, {"train_images": X, "train_targets": np.zeros((2, 3))},
     "/train/targets has shape 2x3 .* it must be N x 2 floating point"),
    ({"targets": 2}, {"train_images": X, "train_targets": np.zeros((3, 2))},
     "/train/targets has 3 entries but /train/images 2"),
    ({"targets": 1}, {"train_images": X, "train_targets": [[0.5], [np.nan]]},
     "/train/targets sample 1 holds NaN; replace the value"),
    ({"targets": 1}, {"train_images": X, "train_targets": [[0.5], [0.0]],
                      "val_images": X, "val_targets": [[-np.inf], [0.0]]},
     "/val/targets sample 0 holds Inf"),
    ({"targets": 1, "version": 4}, {}, "has format version 4; this hpctrain reads versions 1, "
                                       "2 and 3"),
    ({"classes": 2}, {"train_images": np.zeros((2, 1, 1, 2, 2, 2)), "train_labels": [0, 1]},
     "it must be N x C x H x W, N x C x D x H x W or N x F"),
])
def test_malformed_targets_files(tmp_path, attrs, datasets, message):
    raw_file(tmp_path / "m.h5", attrs, **datasets)
    with pytest.raises(DatasetError, match=message):
        inspect_dataset(tmp_path / "m.h5")


@pytest.mark.parametrize("info,input_shape,classes,regression,message", [
    (DatasetInfo("d.h5", VOLUME, 10, 30, 0), VOLUME, 4, True,
     r"holds class labels \(10 classes\) but the net regresses 4 targets; use a targets dataset "
     r"\(python -m hpctrain convert --targets\) or a net whose input line says classes=10"),
    (DatasetInfo("d.h5", VOLUME, 4, 30, 0, 4), VOLUME, 4, False,
     r"holds 4 real-valued targets per sample but the net classifies into 4 classes; use a net "
     r"whose input line says targets=4"),
    (DatasetInfo("d.h5", VOLUME, 4, 30, 0, 4), VOLUME, 3, True,
     r"has 4 targets but the net has 3; use a net whose input line says targets=4"),
    (DatasetInfo("d.h5", (4, 16, 16, 16), 4, 30, 0, 4), (4, 32, 32, 32), 4, True,
     r"shape 4x16x16x16 but the net takes 4x32x32x32; pass --image-size 16"),
    (DatasetInfo("d.h5", (4, 16, 8, 16), 4, 30, 0, 4), (4, 32, 32, 32), 4, True,
     r"shape 4x16x8x16 but the net takes 4x32x32x32; convert the data"),
])
def test_check_fits_labels_against_targets(info, input_shape, classes, regression, message):
    with pytest.raises(DatasetError, match=message):
        check_fits(info, input_shape, classes, 8, regression=regression)


def test_check_fits_accepts_matching_targets():
    check_fits(DatasetInfo("d.h5", VOLUME, 4, 30, 0, 4), VOLUME, 4, 8, regression=True)
    check_fits(DatasetInfo("d.h5", VOLUME, 4, 30, 0, 4), (240,), 4, 8, regression=True)


# --- chunks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,chunks", [
    ((1000, 1, 8, 8), (64, 1, 8, 8)),  # tiny samples share a chunk of 16 KiB
    ((10, 3, 224, 224), (1, 3, 224, 224)),  # up to 1 MiB: one sample
    ((10, 4, 64, 64, 64), (1, 4, 16, 64, 64)),
    ((10, 4, 128, 128, 128), (1, 4, 4, 128, 128)),
    ((10, 4, 512, 512, 512), (1, 1, 1, 512, 512)),  # a plane of all channels is 4 MiB
    ((10, 3, 1024, 1024), (1, 3, 85, 1024)),  # a big image: slabs of rows
    ((10, 1 << 20), (1, 1 << 18)),  # big flat samples: runs of features
])
def test_chunks_are_slabs_of_big_samples(shape, chunks):
    got = chunk_shape(shape)
    assert got == chunks
    chunk_bytes = 4 * math.prod(got)
    one_plane = 4 * math.prod(got[3:]) * got[1] if len(got) > 2 else 0
    assert chunk_bytes <= max(dataset_format.SLAB_BYTES, one_plane)
    if len(shape) == 5 and shape[2] >= 128:
        assert got[2] <= shape[2] // 32  # the depth of a chunk is small beside D


class CountingFile(io.FileIO):
    """A file whose reads are counted in bytes, for h5py's file-object driver."""

    def __init__(self, path):
        super().__init__(path, "r")
        self.bytes_read = 0

    def readinto(self, buffer):
        n = super().readinto(buffer)
        self.bytes_read += n
        return n

    def read(self, size=-1):
        data = super().read(size)
        self.bytes_read += len(data)
        return data


@pytest.fixture
def counted(monkeypatch):
    """Open every dataset through a CountingFile; yields the list of files opened."""
    opened = []

    def open_counted(path):
        raw = CountingFile(path)
        h5 = h5py.File(raw, "r")
        opened.append((raw, h5))
        return h5

    monkeypatch.setattr(dataset_reader, "open_dataset", open_counted)
    yield opened
    for raw, h5 in opened:  # h5py before the file under it
        h5.close()
        raw.close()


def touched_chunks(chunks, samples, box):
    """The chunks a read of ``box`` (sample axes) of ``samples`` meets.

    Along an axis of chunk extent c, the range lo..hi-1 meets chunks lo // c .. (hi - 1) // c;
    a read meets the product of those ranges over the sample axes, for each sample read (each
    sample is its own chunk along the first axis, c = 1, when samples are slabbed).
    """
    per_sample = math.prod((hi - 1) // c - lo // c + 1 for (lo, hi), c in zip(box, chunks[1:],
                                                                               strict=True))
    return len(set(samples)) * per_sample


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_a_rank_reads_only_the_chunks_of_its_depth_slab(tmp_path, monkeypatch, backend, counted,
                                                        ranks):
    monkeypatch.setattr(dataset_format, "SLAB_BYTES", 64 << 10)  # small chunks, small test file
    shape, batch = (2, 32, 32, 32), 3  # 256 KiB samples, chunked (1, 2, 8, 32, 32): 64 KiB
    images, targets = volumes(8, shape, 2)
    write_dataset(tmp_path / "slabs.h5", images, targets=targets)
    info = inspect_dataset(tmp_path / "slabs.h5")
    with h5py.File(tmp_path / "slabs.h5", "r") as h5:
        chunks = h5["train/images"].chunks
        chunk_bytes = {h5["train/images"].id.get_chunk_info(k).size
                       for k in range(h5["train/images"].id.get_num_chunks())}
    stored = (64 << 10) + 4  # each chunk and its Fletcher-32 checksum
    assert chunks == (1, 2, 8, 32, 32) and chunk_bytes == {stored}
    sample_bytes = 4 * math.prod(shape)
    for rank in range(ranks):  # rank r holds depth planes d0..d1, as a domain split gives them
        d0, d1 = rank * 32 // ranks, (rank + 1) * 32 // ranks
        box = ((0, batch), (0, 2), (d0, d1), (0, 32), (0, 32))
        with H5Data(backend, tmp_path / "slabs.h5", batch, SEED, info=info) as data:
            raw = counted[-1][0]
            raw.bytes_read = 0
            got = data.images(1, box)
            read = raw.bytes_read
            samples = data.indices(1, (0, batch))
        np.testing.assert_array_equal(got, images[samples][:, :, d0:d1])
        needed = touched_chunks(chunks, samples, box[1:]) * stored
        assert needed <= read <= needed + (16 << 10)  # its chunks, and a little chunk index
        if ranks > 1:
            assert read < batch * sample_bytes * 0.75  # never the whole samples


# --- the reader ----------------------------------------------------------------------------------


BOXES = [
    ((0, BATCH), (0, 2), (0, 6), (0, 5), (0, 4)),  # the whole batch
    ((0, BATCH), (0, 2), (2, 4), (0, 5), (0, 4)),  # a depth slab (domain parallel)
    ((1, 3), (1, 2), (0, 6), (1, 3), (0, 4)),  # samples, a channel, some rows
    ((3, 4), (0, 1), (5, 6), (4, 5), (3, 4)),  # one voxel
]


@pytest.mark.parametrize("box", BOXES, ids=lambda b: "-".join(f"{lo}:{hi}" for lo, hi in b))
def test_volumes_and_targets_equal_the_block_of_the_whole_batch(path, backend, reads, box):
    images, targets = whole(path)
    with H5Data(backend, path, BATCH, SEED) as data:
        assert (data.sample_shape, data.classes, data.targets) == (VOLUME, TARGETS, TARGETS)
        for step in (0, 2, 3, 7):
            order = data.indices(step, (0, BATCH))
            reads.clear()
            got = data.images(step, box)
            assert reads == [("/train/images", tuple(hi - lo for lo, hi in box))]
            np.testing.assert_array_equal(got, images[order][tuple(slice(*r) for r in box)])
            answers = data.labels(step, box[0])
            assert answers.dtype == np.float64 and answers.shape == (box[0][1] - box[0][0], 3)
            np.testing.assert_array_equal(answers, targets[order][slice(*box[0])])


def test_held_out_targets_pad_with_rows_of_nan(path):
    images, targets = whole(path, "val")  # 6 samples
    single = make_backend("cpu", "float32")
    with H5Data(single, path, 4, SEED, split="val") as data:
        assert data.batches == 2
        last = data.labels(1, (0, 4))
        assert last.dtype == np.float32
        np.testing.assert_array_equal(last[:2], targets[4:])
        assert np.isnan(last[2:]).all()
        np.testing.assert_array_equal(data.images(1, BOXES[0])[:2], images[4:])
        assert not data.images(1, BOXES[0])[2:].any()


# --- the converter -------------------------------------------------------------------------------


def test_convert_volumes_without_channels_and_flat_targets(tmp_path, capsys):
    rng = np.random.default_rng(2)
    np.save(tmp_path / "v.npy", rng.standard_normal((10, 4, 6, 8)))  # (N, D, H, W)
    np.save(tmp_path / "t.npy", rng.standard_normal(10))
    out = tmp_path / "v.h5"
    assert convert_command.run(["--images", f"{tmp_path}/v.npy", "--volumes", "--targets",
                                f"{tmp_path}/t.npy", "--val-fraction", "0.3",
                                "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {out}: 7 train / 3 val samples of shape 1x4x6x8, 1 targets")
    train, train_targets = whole(out)
    val, val_targets = whole(out, "val")
    both = np.concatenate([train, val])[:, 0]
    rows = {np.float32(t).tobytes(): k for k, t in enumerate(np.load(tmp_path / "t.npy"))}
    for x, t in zip(both, np.concatenate([train_targets, val_targets])[:, 0], strict=True):
        np.testing.assert_allclose(x, np.load(tmp_path / "v.npy")[rows[t.tobytes()]], rtol=1e-6)


def test_convert_reads_a_npy_file_a_batch_at_a_time(tmp_path, monkeypatch, capsys):
    images, targets = volumes(9, (2, 4, 4, 4), 4)
    np.save(tmp_path / "v.npy", images)
    np.save(tmp_path / "t.npy", targets)
    np.save(tmp_path / "vv.npy", images[:3] * 2)
    np.save(tmp_path / "vt.npy", targets[:3])
    assert isinstance(arrays.load_array(f"{tmp_path}/v.npy", "images"), np.memmap)
    monkeypatch.setattr(dataset_writer, "WRITE_BYTES", 2 * images[0].nbytes)  # two samples a write
    sliced = []
    original = arrays.Samples.__getitem__

    def spy(self, where):
        out = original(self, where)
        sliced.append(len(out))
        return out

    monkeypatch.setattr(arrays.Samples, "__getitem__", spy)
    convert_command.run(["--images", f"{tmp_path}/v.npy", "--targets", f"{tmp_path}/t.npy",
                         "--val-images", f"{tmp_path}/vv.npy", "--val-targets",
                         f"{tmp_path}/vt.npy", "--scale", "1/2", "--out", f"{tmp_path}/o.h5"])
    assert "9 train / 3 val samples of shape 2x4x4x4, 4 targets" in capsys.readouterr().out
    assert sliced == [2, 2, 2, 2, 1, 2, 1]
    got, got_targets = whole(tmp_path / "o.h5")
    np.testing.assert_array_equal(got, images / 2)
    np.testing.assert_array_equal(got_targets, targets)
    np.testing.assert_array_equal(whole(tmp_path / "o.h5", "val")[0], images[:3])


@pytest.mark.parametrize("args,message", [
    (["--images", "{d}/v.npy", "--labels", "{d}/y.npy", "--targets", "{d}/t.npy"],
     "argument --targets: not allowed with argument --labels"),
    (["--images", "{d}/v.npy"], "--images needs --labels .* or --targets"),
    (["--images", "{d}/v.npy", "--targets", "{d}/nan.npy"],
     "targets '.*nan.npy' hold NaN or infinite values .* first in sample 3"),
    (["--images", "{d}/v.npy", "--targets", "{d}/t.npy", "--classes", "3"],
     "--classes applies to --labels"),
    (["--images", "{d}/v.npy", "--targets", "{d}/t.npy", "--val-images", "{d}/v.npy",
      "--val-labels", "{d}/y.npy"], "--val-labels goes with --labels; give --val-targets"),
    (["--images", "{d}/v.npy", "--targets", "{d}/t.npy", "--val-images", "{d}/v.npy"],
     "give both --val-images and --val-targets"),
    (["--images", "{d}/v.npy", "--targets", "{d}/t3.npy"],
     r"have shape \(6, 3, 1\); give \(N,\) or \(N, T\)"),
    (["--images", "{d}/v3.npy", "--volumes", "--targets", "{d}/t.npy"],
     r"with --volumes give \(N, D, H, W\) or \(N, C, D, H, W\)"),
    (["--images", "{d}/v6.npy", "--targets", "{d}/t.npy"], r"give \(N, H, W\), \(N, C, H, W\)"),
    (["--images", "{d}/v.npy", "--targets", "{d}/t.npy", "--size", "8"],
     "--size applies only to --universe"),
])
def test_convert_refuses_bad_targets_and_volumes(tmp_path, args, message):
    images, targets = volumes(6)
    np.save(tmp_path / "v.npy", images)
    np.save(tmp_path / "v3.npy", images[:, 0, 0])
    np.save(tmp_path / "v6.npy", images[..., None])
    np.save(tmp_path / "t.npy", targets)
    np.save(tmp_path / "t3.npy", targets[:, :, None])
    np.save(tmp_path / "y.npy", np.arange(6))
    targets[3, 1] = np.nan
    np.save(tmp_path / "nan.npy", targets)
    argv = [a.format(d=tmp_path) for a in args] + ["--out", str(tmp_path / "o.h5")]
    with pytest.raises(UserError, match=message):
        convert_command.run(argv)
    assert not (tmp_path / "o.h5").exists()
