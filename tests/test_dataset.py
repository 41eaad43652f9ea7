"""The dataset format, its checks, the rank-local reader and the converter (one process)."""

import os
import re

import h5py
import numpy as np
import pytest

from hpctrain.commands import convert as convert_command
from hpctrain.data.dataset_fit import check_fits, feeds_flat
from hpctrain.data.dataset_format import DatasetError, DatasetInfo, inspect_dataset
from hpctrain.data.dataset_reader import H5Data, flat_cover
from hpctrain.data.dataset_writer import write_dataset
from hpctrain.data.prefetch import Prefetched
from hpctrain.device.backend import make_backend
from hpctrain.errors import UserError
from hpctrain.layout.layout import box_size
from hpctrain.model.net import load_net

N, SHAPE, CLASSES, BATCH, SEED = 23, (3, 6, 5), 4, 5, 7


def random_split(n, shape=SHAPE, classes=CLASSES, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, *shape)).astype(np.float32),
            rng.integers(0, classes, n).astype(np.int64))


@pytest.fixture
def backend():
    return make_backend("cpu", "float64")


@pytest.fixture
def path(tmp_path):
    """A dataset with N training samples of SHAPE and 9 held-out ones."""
    images, labels = random_split(N)
    val_images, val_labels = random_split(9, seed=1)
    out = tmp_path / "d.h5"
    write_dataset(out, images, labels, CLASSES, val_images, val_labels, "random test data")
    return out


def whole(path, split="train"):
    with h5py.File(path, "r") as h5:
        return h5[f"{split}/images"][()], h5[f"{split}/labels"][()]


# --- the format ----------------------------------------------------------------------------------


def test_write_then_inspect_round_trip(path):
    info = inspect_dataset(path)
    assert info == DatasetInfo(path, SHAPE, CLASSES, N, 9)
    with h5py.File(path, "r") as h5:
        assert h5.attrs["format"] == "hpctrain-dataset" and h5.attrs["version"] == 2
        assert h5.attrs["classes"] == CLASSES and h5.attrs["description"] == "random test data"
        images = h5["train/images"]
        assert images.dtype == np.float32 and h5["train/labels"].dtype == np.int64
        assert images.chunks[1:] == SHAPE and images.chunks[0] >= 1
        np.testing.assert_array_equal(images[()], random_split(N)[0])
        np.testing.assert_array_equal(h5["val/labels"][()], random_split(9, seed=1)[1])


def test_flat_samples_and_default_classes(tmp_path):
    images = np.arange(12.0).reshape(4, 3)
    write_dataset(tmp_path / "flat.h5", images, np.array([0, 2, 1, 2]))
    info = inspect_dataset(tmp_path / "flat.h5")
    assert (info.sample_shape, info.classes, info.val_size) == ((3,), 3, 0)


def test_samples_of_big_images_get_a_chunk_each(tmp_path):
    write_dataset(tmp_path / "big.h5", *random_split(3, shape=(3, 40, 40)))
    with h5py.File(tmp_path / "big.h5", "r") as h5:
        assert h5["train/images"].chunks == (1, 3, 40, 40)


@pytest.mark.parametrize("change,message", [
    (lambda a: {**a, "labels": a["labels"][:-1]}, "labels have shape (22,)"),
    (lambda a: {**a, "labels": a["labels"] + 10, "classes": 4}, "outside [0, 4)"),
    (lambda a: {**a, "labels": np.r_[a["labels"][:-1], -1]}, "label -1 is negative"),
    (lambda a: {**a, "labels": a["labels"] * 0.5}, "integer class labels"),
    (lambda a: {**a, "images": np.where(a["images"] > 1, np.nan, a["images"])}, "NaN"),
    (lambda a: {**a, "images": a["images"].astype(np.float64) * 1e300}, "NaN or infinite"),
    (lambda a: {**a, "images": a["images"][:, 0]}, "give (N, C, H, W)"),
    (lambda a: {**a, "val_images": a["images"][:2, :, :4], "val_labels": a["labels"][:2]},
     "val samples have shape 3x4x5 but train samples 3x6x5"),
    (lambda a: {**a, "val_images": a["images"][:2]}, "both val_images and val_labels"),
    (lambda a: {**a, "images": a["images"][:0], "labels": a["labels"][:0]}, "train split is "
     "empty"),
])
def test_write_refuses_bad_arrays(tmp_path, change, message):
    images, labels = random_split(N)
    args = change({"images": images, "labels": labels})
    with pytest.raises(DatasetError, match=re.escape(message)):
        write_dataset(tmp_path / "bad.h5", **args)
    assert not (tmp_path / "bad.h5").exists()


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"dataset '.*x\.h5' does not exist.*convert"):
        inspect_dataset(tmp_path / "x.h5")


def test_not_hdf5(tmp_path):
    (tmp_path / "notes.h5").write_text("not an HDF5 file\n")
    with pytest.raises(DatasetError, match="notes.h5' is not a readable HDF5 file"):
        inspect_dataset(tmp_path / "notes.h5")


def test_truncated_file(tmp_path, backend):
    write_dataset(tmp_path / "cut.h5", *random_split(200))
    data = (tmp_path / "cut.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[:len(data) // 2])
    with pytest.raises(DatasetError, match="cut.h5' is not a readable HDF5 file"):
        inspect_dataset(tmp_path / "cut.h5")
    with pytest.raises(DatasetError, match="not a readable HDF5 file"):
        H5Data(backend, tmp_path / "cut.h5", BATCH)


def raw_file(path, attrs=True, **datasets):
    with h5py.File(path, "w") as h5:
        if attrs:
            h5.attrs.update({"format": "hpctrain-dataset", "version": 1, "classes": CLASSES})
        for name, value in datasets.items():
            h5[name.replace("_", "/")] = value


@pytest.mark.parametrize("attrs,datasets,message", [
    (False, {"train_images": np.zeros((2, 3)), "train_labels": [0, 1]},
     "is not an hpctrain dataset .*python -m hpctrain convert"),
    (True, {"train_images": np.zeros((2, 3))}, "lacks /train/labels; rewrite it"),
    (True, {}, "lacks /train/images and /train/labels"),
    (True, {"train_images": np.zeros((2, 3)), "train_labels": [0, 1], "val_labels": [0]},
     "lacks /val/images"),
    (True, {"train_images": np.zeros((2, 3)), "train_labels": [0, 1, 2]},
     "/train/labels has 3 entries but /train/images 2"),
    (True, {"train_images": np.zeros((2, 3, 4)), "train_labels": [0, 1]},
     "/train/images has shape 2x3x4; it must be N x C x H x W, N x C x D x H x W or N x F"),
    (True, {"train_images": np.zeros((2, 3)), "train_labels": [0, 9]}, "holds 9, outside"),
    (True, {"train_images": np.zeros((2, 3)), "train_labels": [0, 1],
            "val_images": np.zeros((1, 4)), "val_labels": [0]}, "val samples are 4 but train"),
])
def test_malformed_contents(tmp_path, attrs, datasets, message):
    raw_file(tmp_path / "m.h5", attrs, **datasets)
    with pytest.raises(DatasetError, match=message):
        inspect_dataset(tmp_path / "m.h5")


@pytest.mark.parametrize("size,input_shape,classes,batch,message", [
    (8, (1, 12, 12), 10, 4, r"shape 1x8x8 but the net takes 1x12x12; pass --image-size 8"),
    (8, (3, 8, 8), 10, 4, r"shape 1x8x8 but the net takes 3x8x8; convert"),
    (8, (60,), 10, 4, r"but the net takes 60; a flat-input net reads samples of 64 values"),
    (8, (1, 8, 8), 5, 4, r"has 10 classes but the net has 5; use a net .* classes=10"),
    (8, (1, 8, 8), 10, 40, r"has 30 training samples, fewer than --batch 40"),
])
def test_check_fits(size, input_shape, classes, batch, message):
    info = DatasetInfo("d.h5", (1, size, size), 10, 30, 0)
    with pytest.raises(DatasetError, match=message):
        check_fits(info, input_shape, classes, batch)


def test_smallcnn_fits_8x8_digits_shape():
    net = load_net("smallcnn")
    check_fits(DatasetInfo("d.h5", (1, 8, 8), 10, 100, 0), net.input_shape, net.classes, 32)


# --- the reader ----------------------------------------------------------------------------------


def test_train_order_is_a_fresh_seeded_permutation_per_epoch(path, backend):
    with H5Data(backend, path, BATCH, SEED) as data:
        assert (data.size, data.steps_per_epoch, data.sample_shape, data.classes) == (
            N, N // BATCH, SHAPE, CLASSES)
        per_epoch = data.steps_per_epoch * BATCH  # 20 of 23: the remainder is dropped
        epochs = []
        for epoch in range(3):
            steps = range(epoch * data.steps_per_epoch, (epoch + 1) * data.steps_per_epoch)
            order = np.concatenate([data.indices(s, (0, BATCH)) for s in steps])
            want = np.random.default_rng([SEED, epoch]).permutation(N)[:per_epoch]
            np.testing.assert_array_equal(order, want)
            assert len(set(order.tolist())) == per_epoch
            epochs.append(order)
        assert not np.array_equal(epochs[0], epochs[1])
    with H5Data(backend, path, BATCH, SEED) as again, H5Data(backend, path, BATCH, 8) as other:
        np.testing.assert_array_equal(again.indices(5, (0, BATCH)), epochs[1][BATCH:2 * BATCH])
        assert not np.array_equal(other.indices(0, (0, BATCH)), epochs[0][:BATCH])


BOXES = [
    ((0, BATCH), (0, 3), (0, 6), (0, 5)),  # the whole batch
    ((1, 4), (0, 3), (0, 6), (0, 5)),  # a batch shard
    ((0, BATCH), (0, 3), (2, 4), (0, 5)),  # a band of rows (domain parallel)
    ((2, 5), (1, 3), (0, 6), (0, 5)),  # channels (model parallel, replicated input sliced)
    ((3, 4), (2, 3), (5, 6), (1, 4)),  # one sample, channel, row; some columns
]


@pytest.mark.parametrize("box", BOXES, ids=lambda b: "-".join(f"{lo}:{hi}" for lo, hi in b))
def test_images_equal_the_block_of_the_whole_batch(path, backend, box):
    images, labels = whole(path)
    with H5Data(backend, path, BATCH, SEED) as data:
        for step in (0, 3, 4, 9):
            batch = images[data.indices(step, (0, BATCH))]  # the whole batch, in batch order
            got = data.images(step, box)
            assert got.dtype == np.float64
            np.testing.assert_array_equal(got, batch[tuple(slice(a, b) for a, b in box)])
            np.testing.assert_array_equal(
                data.labels(step, box[0]), labels[data.indices(step, (0, BATCH))][slice(*box[0])])


@pytest.mark.parametrize("box", BOXES, ids=lambda b: "-".join(f"{lo}:{hi}" for lo, hi in b))
def test_only_the_hyperslab_is_read(path, backend, reads, box):
    with H5Data(backend, path, BATCH, SEED) as data:
        reads.clear()
        data.images(2, box)
        data.labels(2, box[0])
    image_reads = [shape for name, shape in reads if name == "/train/images"]
    label_reads = [shape for name, shape in reads if name == "/train/labels"]
    assert image_reads == [tuple(hi - lo for lo, hi in box)]
    assert sum(np.prod(s) for s in image_reads) == box_size(box)
    assert label_reads == [(box[0][1] - box[0][0],)]


def test_flat_cover_is_the_smallest_hyperslab_of_that_form():
    shape = (3, 6, 5)
    for lo in range(90):
        for hi in range(lo + 1, 91):
            slices, first = flat_cover(shape, lo, hi)
            flat = np.arange(90).reshape(shape)[slices].ravel()
            assert flat[0] == first and list(flat[lo - first:hi - first]) == list(range(lo, hi))
            spanned = next((k for k, s in enumerate(slices) if s.stop - s.start > 1), 2)
            assert all(s.stop - s.start == 1 for s in slices[:spanned])  # leading axes fixed
            assert all(s == slice(0, n) for s, n in zip(slices[spanned + 1:],
                                                         shape[spanned + 1:], strict=True))


@pytest.mark.parametrize("features", [(0, 90), (0, 45), (45, 90), (31, 32), (12, 29)])
def test_a_flat_input_net_reads_images_flattened(path, backend, reads, features):
    images, _ = whole(path)
    assert feeds_flat(SHAPE, (90,)) and not feeds_flat(SHAPE, (91,))
    box = ((1, 4), features)
    with H5Data(backend, path, BATCH, SEED, flatten=True) as data:
        assert data.sample_shape == (90,)
        reads.clear()
        got = data.images(3, box)
        flat = images[data.indices(3, (0, BATCH))].reshape(BATCH, -1)
        np.testing.assert_array_equal(got, flat[1:4, slice(*features)])
    (name, shape), = reads
    slices, _ = flat_cover(SHAPE, *features)
    assert shape == (3, *(s.stop - s.start for s in slices))  # the cover only
    check_fits(DatasetInfo(path, SHAPE, CLASSES, N, 9), (90,), CLASSES, BATCH)


def test_val_split_is_sequential_and_padded(path, backend):
    images, labels = whole(path, "val")  # 9 samples
    with H5Data(backend, path, 4, SEED, split="val") as data:
        assert (data.size, data.batches) == (9, 3)
        box = ((0, 4), (0, 3), (0, 6), (0, 5))
        np.testing.assert_array_equal(data.images(1, box), images[4:8])
        np.testing.assert_array_equal(data.labels(0, (0, 4)), labels[:4])
        last = data.images(2, box)
        np.testing.assert_array_equal(last[0], images[8])
        assert not last[1:].any()
        np.testing.assert_array_equal(data.labels(2, (0, 4)), [labels[8], -1, -1, -1])
        np.testing.assert_array_equal(data.labels(2, (2, 4)), [-1, -1])
        assert not data.images(2, ((1, 3), (0, 1), (0, 2), (0, 2))).any()


def test_a_nan_or_inf_read_is_noted_with_its_sample_not_raised(path, backend):
    with h5py.File(path, "r+") as h5:  # write_dataset refuses them; edit the file afterwards
        h5["train/images"][17, 1, 2, 3] = np.nan
        h5["val/images"][6, 0, 0, 0] = -np.inf
    box = ((0, BATCH), (0, 3), (0, 6), (0, 5))
    with H5Data(backend, path, BATCH, SEED) as data:
        step = next(s for s in range(N) if 17 in data.indices(s, (0, BATCH)))
        at = int(np.flatnonzero(data.indices(step, (0, BATCH)) == 17)[0])
        data.images(step, ((at, at + 1), (0, 3), (0, 2), (0, 5)))  # rows 0-1 of sample 17
        assert data.nonfinite is None  # the NaN is in row 2, outside this slab
        data.images(step, box)
        assert data.nonfinite.startswith(f"dataset '{path}': /train/images sample 17 holds NaN")
    with H5Data(backend, path, 4, SEED, split="val") as data:
        data.images(0, ((0, 4), (0, 3), (0, 6), (0, 5)))  # samples 0-3
        assert data.nonfinite is None
        data.images(1, ((0, 4), (0, 3), (0, 6), (0, 5)))
        assert "/val/images sample 6 holds Inf" in data.nonfinite


def volumes(path, n=48):
    """``n`` training samples of 1x64x64 float32, 16 KiB: one chunk each, so each sample's
    bytes lie in the file apart from the others'."""
    images, labels = random_split(n, (1, 64, 64))
    write_dataset(path, images, labels, CLASSES)
    return path


def chunk_of(path, sample, split="train", name="images"):
    """(byte offset, size) of the chunk that holds ``sample``."""
    with h5py.File(path, "r") as h5:
        dataset = h5[f"{split}/{name}"]
        info = dataset.id.get_chunk_info_by_coord(
            (sample // dataset.chunks[0] * dataset.chunks[0],) + (0,) * (dataset.ndim - 1))
        return info.byte_offset, info.size


def test_a_file_cut_short_while_read_names_the_first_sample_past_its_end(tmp_path, backend):
    """HDF5 reads the part of a chunk past the end of a shortened file as zeros, with no
    error; the reader compares the file's size with what each read needs."""
    path = volumes(tmp_path / "v.h5")
    cut = chunk_of(path, 30)[0]  # samples 0..29 stay whole
    box = ((0, 8), (0, 1), (0, 64), (0, 64))
    with h5py.File(path, "r") as h5:
        whole = h5["train/images"][()]
    with H5Data(backend, path, 8, SEED) as data:
        np.testing.assert_array_equal(data.images(0, box), whole[data.indices(0, (0, 8))])
        os.truncate(path, cut)
        for step in range(data.steps_per_epoch):
            index = data.indices(step, (0, 8))
            block = data.images(step, box)
            if index.max() < 30:  # every sample still whole: read as it is
                assert data.nonfinite is None
                np.testing.assert_array_equal(block, whole[index])
                continue
            past = min(i for i in index if i >= 30)  # the first the reader meets
            assert not block.any()  # never the zeros HDF5 read as numbers
            assert data.nonfinite.startswith(
                f"dataset '{path}': /train/images sample {past} cannot be read (the file is "
                f"{cut:,} bytes, cut short of the ")
            assert "the file is damaged: rewrite it with python -m hpctrain convert" in (
                data.nonfinite)
            break
        else:
            pytest.fail("no batch met the cut")


def test_a_changed_chunk_fails_its_checksum_and_is_named(tmp_path, backend):
    path = volumes(tmp_path / "v.h5")
    offset, _ = chunk_of(path, 17)
    with open(path, "r+b") as f:  # one byte of sample 17 changed, as a disk or a copy may
        f.seek(offset + 100)
        byte = f.read(1)
        f.seek(offset + 100)
        f.write(bytes([byte[0] ^ 0x10]))
    box = ((0, 8), (0, 1), (0, 64), (0, 64))
    with H5Data(backend, path, 8, SEED) as data:
        step = next(s for s in range(6) if 17 in data.indices(s, (0, 8)))
        for s in range(step):
            data.images(s, box)
            assert data.nonfinite is None
        block = data.images(step, box)
        assert not block[data.indices(step, (0, 8)) == 17].any()  # never the changed numbers
        assert data.nonfinite.startswith(f"dataset '{path}': /train/images sample 17 cannot be "
                                         f"read (HDF5: ")
        assert "a checksum does not match); the file is damaged" in data.nonfinite


def test_changed_labels_are_named_and_stand_in_valid(tmp_path, backend):
    path = volumes(tmp_path / "v.h5")
    offset, _ = chunk_of(path, 0, name="labels")  # every label in one chunk
    with open(path, "r+b") as f:
        f.seek(offset + 8 * 5)
        f.write(b"\x07")
    with pytest.raises(DatasetError, match=r"not a readable HDF5 file \(.*filter"):
        inspect_dataset(path)  # what opening checks
    info = DatasetInfo(path, (1, 64, 64), CLASSES, 48, 0)  # as rank 0 found it before
    with H5Data(backend, path, 8, SEED, info=info) as data, Prefetched(data) as ahead:
        labels = ahead.labels(0, (0, 8))  # a read of labels alone, through the thread
        assert labels.tolist() == [0] * 8
        assert ahead.nonfinite.startswith(f"dataset '{path}': /train/labels sample ")


def test_files_without_checksums_are_still_read(tmp_path, backend):
    images, labels = random_split(10)
    raw_file(tmp_path / "v1.h5", train_images=images, train_labels=labels)
    with h5py.File(tmp_path / "v1.h5", "r") as h5:
        assert not h5["train/images"].fletcher32
    with H5Data(backend, tmp_path / "v1.h5", 5, SEED) as data:
        box = ((0, 5), (0, 3), (0, 6), (0, 5))
        np.testing.assert_array_equal(data.images(1, box), images[data.indices(1, (0, 5))])
        np.testing.assert_array_equal(data.labels(1, (0, 5)), labels[data.indices(1, (0, 5))])
        assert data.nonfinite is None


def test_reader_refusals(tmp_path, path, backend):
    write_dataset(tmp_path / "noval.h5", *random_split(6))
    with pytest.raises(DatasetError, match="no held-out split .*--val-fraction"):
        H5Data(backend, tmp_path / "noval.h5", 2, split="val")
    with pytest.raises(DatasetError, match="has 23 training samples, fewer than --batch 24"):
        H5Data(backend, path, 24)
    with pytest.raises(UserError, match=r"--seed -1 must be an integer in \[0, 2\*\*63\)"):
        H5Data(backend, path, 4, seed=-1)
    with pytest.raises(DatasetError, match="unknown split 'test'"):
        H5Data(backend, path, 4, split="test")


def test_close_and_context_manager_release_the_file(path, backend):
    data = H5Data(backend, path, BATCH)
    assert data._file.id.valid
    data.close()
    assert not data._file.id.valid
    with H5Data(backend, path, BATCH) as data:
        data.images(0, BOXES[0])
    assert not data._file.id.valid


# --- the converter -------------------------------------------------------------------------------


def test_convert_npy_images_get_a_channel_and_scale(tmp_path, capsys):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (20, 7, 7)).astype(np.uint8)
    labels = rng.integers(0, 3, 20)
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", labels)
    out = tmp_path / "out.h5"
    assert convert_command.run(
        ["--images", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
         "--out", str(out), "--scale", "1/255", "--classes", "5"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {out}: 20 train / 0 val samples of shape 1x7x7, 5 classes")
    got_images, got_labels = whole(out)
    np.testing.assert_allclose(got_images[:, 0], images / 255, rtol=1e-6)
    np.testing.assert_array_equal(got_labels, labels)


def test_convert_npz_keys_and_val_fraction(tmp_path, capsys):
    images, labels = random_split(50, shape=(2, 4, 4))
    np.savez(tmp_path / "all.npz", x=images, y=labels)
    out = tmp_path / "out.h5"
    convert_command.run(["--images", f"{tmp_path}/all.npz:x", "--labels", f"{tmp_path}/all.npz:y",
                         "--val-fraction", "0.2", "--seed", "4", "--out", str(out)])
    assert "40 train / 10 val samples of shape 2x4x4, 4 classes" in capsys.readouterr().out
    train, train_labels = whole(out)
    val, val_labels = whole(out, "val")
    # a split of the original samples: each appears once, in one split, labels following
    rows = {images[k].tobytes(): labels[k] for k in range(50)}
    seen = [(x.tobytes(), y) for x, y in zip(np.concatenate([train, val]),
                                             np.concatenate([train_labels, val_labels]))]
    assert len({x for x, _ in seen}) == 50 and all(rows[x] == y for x, y in seen)


def test_convert_explicit_val_arrays_and_flat_samples(tmp_path, capsys):
    for name, (x, y) in {"tr": random_split(8, (6,)), "va": random_split(3, (6,), seed=2)}.items():
        np.save(tmp_path / f"{name}_x.npy", x)
        np.save(tmp_path / f"{name}_y.npy", y.astype(np.float64))  # whole-valued floats are fine
    convert_command.run(
        ["--images", f"{tmp_path}/tr_x.npy", "--labels", f"{tmp_path}/tr_y.npy",
         "--val-images", f"{tmp_path}/va_x.npy", "--val-labels", f"{tmp_path}/va_y.npy",
         "--classes", "4", "--out", f"{tmp_path}/o.h5"])
    assert "8 train / 3 val samples of shape 6, 4 classes" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--images", "{d}/missing.npy", "--labels", "{d}/y.npy"], "images file .*missing.npy' does "
     "not exist"),
    (["--images", "{d}/a.npz:z", "--labels", "{d}/y.npy"], "has no array 'z'; it has x, y"),
    (["--images", "{d}/a.npz", "--labels", "{d}/y.npy"], "holds arrays x, y; pick one"),
    (["--images", "{d}/text.npy", "--labels", "{d}/y.npy"], "not a readable .npy"),
    (["--images", "{d}/x.npy"], "--images needs --labels"),
    (["--images", "{d}/x.npy", "--labels", "{d}/y.npy", "--val-fraction", "1.5"],
     "--val-fraction 1.5 must be in"),
    (["--images", "{d}/x.npy", "--labels", "{d}/y.npy", "--val-fraction", "0.01"],
     "leaves an empty split"),
    (["--images", "{d}/x.npy", "--labels", "{d}/y.npy", "--val-images", "{d}/x.npy"],
     "both --val-images and --val-labels"),
    (["--images", "{d}/x.npy", "--labels", "{d}/bad_y.npy"], "not whole numbers"),
    (["--images", "{d}/x.npy", "--labels", "{d}/y.npy", "--classes", "2"], "outside \\[0, 2\\)"),
    (["--digits", "--scale", "2"], "--scale does not apply to --digits"),
])
def test_convert_refusals(tmp_path, args, message):
    images, labels = random_split(10)
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", labels)
    np.save(tmp_path / "bad_y.npy", labels + 0.5)
    np.savez(tmp_path / "a.npz", x=images, y=labels)
    (tmp_path / "text.npy").write_text("hello")
    argv = [a.format(d=tmp_path) for a in args] + ["--out", str(tmp_path / "o.h5")]
    with pytest.raises(DatasetError, match=message):
        convert_command.run(argv)


def test_convert_parser_has_both_forms():
    text = convert_command.build_parser().format_help()
    assert "python -m hpctrain convert" in text
    for flag in ("--images", "--labels", "--digits", "--val-fraction", "--scale", "--out"):
        assert flag in text


def test_convert_digits(tmp_path, capsys, backend):
    pytest.importorskip("sklearn")
    out = tmp_path / "digits.h5"
    assert convert_command.run(["--digits", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {out}: 1438 train / 359 val samples of shape 1x8x8, 10 classes")
    net = load_net("smallcnn")
    info = inspect_dataset(out)
    check_fits(info, net.input_shape, net.classes, 32)
    images, labels = whole(out)
    assert images.min() == 0 and images.max() == 1 and set(labels.tolist()) == set(range(10))
    with h5py.File(out, "r") as h5:
        assert "load_digits" in h5.attrs["description"]
    with H5Data(backend, out, 32, split="val") as val:
        assert val.batches == 12


def test_convert_refuses_channels_last_arrays_it_would_misread(tmp_path):
    """(N, 16, 16, 3) read channels-first would be 16 channels of 16×3: refused, naming both
    flags; --channels-last moves the channels first (the samples equal the transpose);
    --channels-first keeps the array as it is; the flags are refused where no array is read."""
    rng = np.random.default_rng(0)
    x = rng.random((12, 16, 16, 3), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(12) % 3)
    base = ["--images", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]
    with pytest.raises(DatasetError, match=r"look channels-last .*--channels-last .*"
                                           r"--channels-first"):
        convert_command.run([*base, "--out", str(tmp_path / "a.h5")])
    assert not (tmp_path / "a.h5").exists()
    assert convert_command.run([*base, "--channels-last", "--out", str(tmp_path / "b.h5")]) == 0
    with h5py.File(tmp_path / "b.h5") as h5:
        assert np.array_equal(h5["train/images"][()], np.moveaxis(x, -1, 1))
    assert convert_command.run([*base, "--channels-first", "--out", str(tmp_path / "c.h5")]) == 0
    with h5py.File(tmp_path / "c.h5") as h5:
        assert h5["train/images"].shape == (12, 16, 16, 3)
    with pytest.raises(DatasetError, match="--channels-last describes --images"):
        convert_command.run(["--digits", "--channels-last", "--out", str(tmp_path / "d.h5")])
    np.save(tmp_path / "g.npy", x[..., 0])
    with pytest.raises(DatasetError, match="no channel axis"):
        convert_command.run(["--images", str(tmp_path / "g.npy"), "--labels",
                             str(tmp_path / "y.npy"), "--channels-last",
                             "--out", str(tmp_path / "e.h5")])
