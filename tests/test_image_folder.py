"""convert --image-folder: a folder of JPEG/PNG files per class into a uint8 dataset, and
H5Data's normalised reading of it."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw  # noqa: E402

from hpctrain.cli import main  # noqa: E402
from hpctrain.data.dataset import H5Data, inspect_dataset  # noqa: E402
from hpctrain.data.folder import decode  # noqa: E402
from hpctrain.device.backend import make_backend  # noqa: E402

SHAPES = ("circle", "square", "triangle")
SIZE = 16


def draw(kind: str, rng: np.random.Generator) -> Image.Image:
    """A random-sized image with a filled shape of a random colour at a random place."""
    width, height = (int(v) for v in rng.integers(20, 60, 2))
    image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(0, 256, 3)))
    pen = ImageDraw.Draw(image)
    r = int(rng.integers(4, min(width, height) // 2))
    x, y = int(rng.integers(r, width - r + 1)), int(rng.integers(r, height - r + 1))
    colour = tuple(int(v) for v in rng.integers(0, 256, 3))
    if kind == "circle":
        pen.ellipse((x - r, y - r, x + r, y + r), fill=colour)
    elif kind == "square":
        pen.rectangle((x - r, y - r, x + r, y + r), fill=colour)
    else:
        pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=colour)
    return image


def make_folder(root, per_class: int, seed: int, broken: bool = False):
    rng = np.random.default_rng(seed)
    for kind in SHAPES:
        (root / kind).mkdir(parents=True)
        for k in range(per_class):
            suffix = "png" if k % 3 == 0 else "jpg"
            draw(kind, rng).save(root / kind / f"{k:03d}.{suffix}")
    if broken:
        good = (root / "circle" / "001.jpg").read_bytes()
        (root / "circle" / "002.jpg").write_bytes(good[:len(good) // 3])  # truncated JPEG
        (root / "square" / "notes.txt").write_text("not an image\n")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("images") / "train", 8, seed=1, broken=True)


def convert(*args) -> int:
    return main(["convert", *map(str, args)])


def test_classes_shapes_stats_and_bad_files(folder, tmp_path, capsys):
    out = tmp_path / "d.h5"
    assert convert("--image-folder", folder, "--size", SIZE, "--workers", 1, "--out", out) == 0
    err = capsys.readouterr().err
    assert "skipped 2 unreadable files" in err
    assert "circle/002.jpg" in err and "square/notes.txt" in err
    info = inspect_dataset(out)
    assert (info.sample_shape, info.classes, info.train_size, info.val_size) == (
        (3, SIZE, SIZE), 3, 3 * 8 - 1, 0)
    assert info.dtype == "uint8" and "(x - mean) / std" in info.normalisation
    with h5py.File(out) as h5:
        x, y = h5["train/images"][()], h5["train/labels"][()]
        assert x.dtype == np.uint8 and h5.attrs["version"] == 3
        mean, std = h5.attrs["mean"], h5.attrs["std"]
    # in file order: the classes' sorted files, the unreadable ones left out
    bad = {folder / "circle" / "002.jpg", folder / "square" / "notes.txt"}
    files = [p for kind in SHAPES for p in sorted((folder / kind).iterdir()) if p not in bad]
    assert y.tolist() == [SHAPES.index(p.parent.name) for p in files]
    assert np.array_equal(x, np.stack([decode(str(p), SIZE) for p in files]))
    pixels = x.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float64)
    np.testing.assert_allclose(mean, pixels.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(std, pixels.std(axis=1), rtol=1e-12)


def test_decode_resizes_the_shorter_side_and_crops_the_centre(tmp_path):
    image = np.zeros((40, 80, 3), np.uint8)
    image[:, 20:60] = 255  # the centre square 40x40 is white, the sides black
    Image.fromarray(image).save(tmp_path / "wide.png")
    x = decode(str(tmp_path / "wide.png"), 8)
    assert x.shape == (3, 8, 8) and x.dtype == np.uint8
    assert (x[:, :, 1:-1] == 255).all() and x.min() > 128  # the filter reaches just outside
    assert decode(str(tmp_path / "missing.png"), 8).startswith("FileNotFoundError")


def test_strict_refuses_naming_the_bad_file(folder, tmp_path, capsys):
    out = tmp_path / "d.h5"
    assert convert("--image-folder", folder, "--size", SIZE, "--strict", "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "circle/002.jpg is not a readable image" in err
    assert "Traceback" not in err and not out.exists()
    assert not list(tmp_path.iterdir())  # no temporary left either


def test_one_and_two_workers_write_the_same_data(folder, tmp_path):
    for workers in (1, 2):
        assert convert("--image-folder", folder, "--size", SIZE, "--workers", workers,
                       "--val-fraction", 0.25, "--out", tmp_path / f"w{workers}.h5") == 0
    with h5py.File(tmp_path / "w1.h5") as one, h5py.File(tmp_path / "w2.h5") as two:
        for name in ("train/images", "train/labels", "val/images", "val/labels"):
            assert one[name][()].tobytes() == two[name][()].tobytes(), name
        for name in ("mean", "std", "classes", "version"):
            assert np.array_equal(one.attrs[name], two.attrs[name])
        assert len(one["val/labels"]) + len(one["train/labels"]) == 23


def test_val_folder_has_the_training_classes(folder, tmp_path, capsys):
    val = make_folder(tmp_path / "val", 2, seed=2)
    out = tmp_path / "d.h5"
    assert convert("--image-folder", folder, "--val-folder", val, "--size", SIZE,
                   "--out", out) == 0
    info = inspect_dataset(out)
    assert (info.train_size, info.val_size) == (23, 6)
    with h5py.File(out) as h5:
        assert h5["val/labels"][()].tolist() == [0, 0, 1, 1, 2, 2]
        assert h5["val/images"].dtype == np.uint8
    (val / "zebra").mkdir()
    capsys.readouterr()
    assert convert("--image-folder", folder, "--val-folder", val, "--size", SIZE,
                   "--out", tmp_path / "e.h5") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "class 'zebra'" in err


@pytest.mark.parametrize("args,message", [
    (["--workers", "0"], "--workers 0 must be at least 1"),
    (["--val-fraction", "0.5", "--val-folder", "."], "cannot be combined with --val-folder"),
    (["--channels", "2"], "--channels applies only to --universe"),
    (["--labels", "y.npy"], "--labels does not apply to --image-folder"),
])
def test_refusals_are_one_line(folder, tmp_path, capsys, args, message):
    assert convert("--image-folder", folder, "--size", SIZE, *args,
                   "--out", tmp_path / "d.h5") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_folder_flags_need_an_image_folder(tmp_path, capsys):
    assert convert("--digits", "--strict", "--out", tmp_path / "d.h5") == 2
    assert "--strict applies only to --image-folder" in capsys.readouterr().err


def test_an_existing_file_is_not_clobbered(folder, tmp_path, capsys):
    out = tmp_path / "mine.h5"
    out.write_text("someone else's file\n")
    assert convert("--image-folder", folder, "--size", SIZE, "--out", out) == 2
    assert "exists and is not an hpctrain dataset" in capsys.readouterr().err
    assert out.read_text() == "someone else's file\n"


def test_h5data_normalises_each_block_as_the_whole(folder, tmp_path):
    out = tmp_path / "d.h5"
    assert convert("--image-folder", folder, "--size", SIZE, "--val-fraction", 0.25,
                   "--out", out) == 0
    with h5py.File(out) as h5:
        x, mean, std = h5["train/images"][()], h5.attrs["mean"], h5.attrs["std"]
    backend = make_backend("cpu", "float32")
    whole = ((x.astype(np.float32) - mean.astype(np.float32)[None, :, None, None])
             / std.astype(np.float32)[None, :, None, None])
    with H5Data(backend, out, batch=8, seed=3) as data:
        order = data.indices(0, (0, 8))
        box = ((2, 7), (1, 3), (4, 11), (0, SIZE))  # samples, channels, rows, columns
        got = data.images(0, box)
        want = whole[order[2:7]][:, 1:3, 4:11, 0:SIZE]
        assert got.dtype == np.float32 and np.array_equal(got, want)
        assert abs(float(np.mean(data.images(0, ((0, 8), (0, 3), (0, SIZE), (0, SIZE)))))) < 2
    with H5Data(backend, out, batch=8, split="val") as val:  # padding stays zero
        last = val.images(val.batches - 1, ((0, 8), (0, 3), (0, SIZE), (0, SIZE)))
        assert (last[val.size % 8 or 8:] == 0).all()



def test_ctrl_c_stops_a_parallel_conversion_in_one_line_leaving_nothing(tmp_path):
    """Ctrl-C raised inside a process pool's machinery could leave it waiting forever; it is
    noted and raised between tasks, so the run stops at once, says so in one line (status
    130) and leaves no output."""
    import signal
    import subprocess
    import sys
    import time

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        folder = tmp_path / "big" / f"class{c}"
        folder.mkdir(parents=True)
        for k in range(1500):
            Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(
                folder / f"{k:04d}.png", compress_level=0)
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "convert", "--image-folder", "big", "--size", "32",
         "--workers", "2", "--out", "out.h5"], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while [p.name for p in tmp_path.iterdir()] == ["big"] and time.monotonic() < deadline:
        time.sleep(0.01)  # until the file is being written: the pool is decoding
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert err.replace("\r", "\n").strip().splitlines()[-1] == "hpctrain convert: interrupted"
    assert [p.name for p in tmp_path.iterdir()] == ["big"]
