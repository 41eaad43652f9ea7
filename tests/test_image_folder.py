"""convert --image-folder: a folder of JPEG/PNG files per class into a uint8 dataset, and
H5Data's normalised reading of it."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw  # noqa: E402

from hpctrain.cli import main  # noqa: E402
from hpctrain.data.dataset_format import DatasetError, inspect_dataset  # noqa: E402
from hpctrain.data.dataset_reader import H5Data  # noqa: E402
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


def run_convert_with(tmp_path, code: str, *args: str, timeout: float = 30):
    """``python -m hpctrain convert ARGS`` in a fresh interpreter that first runs ``code`` (a
    stand-in for what the system does to the run, e.g. a worker that gets killed)."""
    import subprocess
    import sys

    script = f"import sys\n{code}\nfrom hpctrain.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, "convert", *map(str, args)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


DIES_ON_A_SQUARE = """
import os, signal
import hpctrain.data.folder as folder
decode_task = folder._decode_task
def dying(paths, size):  # as the out-of-memory killer would, in the middle of the run
    if any(p.endswith("005.jpg") and "square" in p for p in paths):
        os.kill(os.getpid(), signal.SIGKILL)
    return decode_task(paths, size)
folder._decode_task = dying
"""


def test_a_lost_worker_ends_the_run_in_one_line_leaving_nothing(folder, tmp_path):
    """A worker killed with its task made the pool wait for that task forever."""
    result = run_convert_with(tmp_path, DIES_ON_A_SQUARE, "--image-folder", folder, "--size",
                              SIZE, "--workers", 2, "--out", tmp_path / "out" / "d.h5")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "hpctrain convert: error: a decoding worker process was lost (pid "), result.stderr
    assert "killed by SIGKILL), perhaps to the out-of-memory killer; nothing was written" in (
        lines[0])
    assert list(tmp_path.iterdir()) == []  # nor the directory made for --out


def test_a_class_folder_whose_name_is_not_utf8_is_a_class_shown_escaped(tmp_path, capsys):
    """Such a name made the description attribute raise UnicodeEncodeError (a traceback)."""
    root = tmp_path / "train"
    make_folder(root, 2, seed=3)
    import os

    os.rename(root / "circle", os.fsencode(root) + b"/caf\xe9")  # Latin-1, not UTF-8
    out = tmp_path / "d.h5"
    assert convert("--image-folder", root, "--size", SIZE, "--out", out) == 0
    info = inspect_dataset(out)
    assert (info.classes, info.train_size) == (3, 6)
    with h5py.File(out) as h5:
        assert "sub-folders caf\\xe9, square, triangle" in h5.attrs["description"]


def name_files(root, names):
    """Files named ``names`` (not images) in the first class folder of ``root``."""
    for name in names:
        (root / "circle" / name).write_text("not an image\n")


FORGED = "evil\nhpctrain: error: fake.txt"


def test_file_names_are_shown_escaped_on_one_line(tmp_path, capsys):
    """A line break in a name split the skipped-files line, and under --strict forged a
    second error line."""
    root = make_folder(tmp_path / "train", 2, seed=4)
    name_files(root, [FORGED, "tab\there.txt"])
    assert convert("--image-folder", root, "--size", SIZE, "--out", tmp_path / "d.h5") == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("skipped 2 unreadable files: ") and len(lines) == 2, lines
    assert "circle/evil\\nhpctrain: error: fake.txt'" in lines[-1]
    assert "circle/tab\\there.txt'" in lines[-1]
    assert convert("--image-folder", root, "--size", SIZE, "--strict",
                   "--out", tmp_path / "e.h5") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "evil\\nhpctrain: error: fake.txt' is not a readable" in lines[0]


def test_an_empty_class_folder_is_refused_unless_allowed(tmp_path, capsys):
    root = make_folder(tmp_path / "train", 2, seed=5)
    (root / "hexagon").mkdir()  # a download that failed
    assert convert("--image-folder", root, "--size", SIZE, "--out", tmp_path / "d.h5") == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hpctrain: error: --image-folder {root} has 1 empty class sub-folder, "
                   f"'hexagon': a class with no image; remove it, or pass --allow-empty to "
                   f"keep such classes")
    assert list(tmp_path.iterdir()) == [tmp_path / "train"]
    assert convert("--image-folder", root, "--size", SIZE, "--allow-empty",
                   "--out", tmp_path / "d.h5") == 0
    assert inspect_dataset(tmp_path / "d.h5").classes == 4  # hexagon is class 1, unseen
    assert convert("--digits", "--allow-empty", "--out", tmp_path / "e.h5") == 2
    assert "--allow-empty applies only to --image-folder" in capsys.readouterr().err


def test_a_refused_conversion_leaves_no_directory_it_made(folder, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "d.h5"
    assert convert("--image-folder", folder, "--size", SIZE, "--strict", "--out", out) == 2
    assert "is not a readable image" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()  # a directory that was there stays
    assert convert("--image-folder", folder, "--size", SIZE, "--strict",
                   "--out", tmp_path / "mine" / "sub" / "d.h5") == 2
    assert [p.name for p in tmp_path.rglob("*")] == ["mine"]


def test_size_and_workers_are_bounded_by_memory_and_cpus(folder, tmp_path, capsys,
                                                         monkeypatch):
    """--size 100000 raised MemoryError (or the kernel killed a worker); --workers 1000 forked
    1000 processes for 20 files."""
    from hpctrain.data import folder as folder_module
    from hpctrain.data.folder import plan_pipeline

    monkeypatch.setattr(folder_module, "available_bytes", lambda: float(16 << 30))
    monkeypatch.setattr(folder_module, "available_cpus", lambda: 4)
    assert convert("--image-folder", folder, "--size", 100000, "--out", tmp_path / "d.h5") == 2
    assert capsys.readouterr().err == (
        "hpctrain: error: --size 100000: one 100000 x 100000 image needs 27.9 GiB (3 bytes a "
        "pixel), held about 6 times over while it is decoded and written, 168 GiB in all: "
        "more than the 16 GiB of memory available; choose --size 30893 or less\n")
    assert convert("--image-folder", folder, "--size", SIZE, "--workers", 1000,
                   "--out", tmp_path / "d.h5") == 2
    assert capsys.readouterr().err == (
        "hpctrain: error: --workers 1000: this process may use 4 CPUs (its CPU affinity), so "
        "more decoding processes only compete for them; give --workers 4 or fewer\n")
    assert list(tmp_path.iterdir()) == []
    assert plan_pipeline(30893, 1, 1).peak_bytes <= 16 << 30 < plan_pipeline(30894, 1, 1,
                                                                              1e30).peak_bytes
    assert plan_pipeline(SIZE, 20, None).workers == 2  # 2 tasks of 16 files: 2 workers
    big = plan_pipeline(4096, 10_000, None)  # 48 MiB images: one per task and per write
    assert (big.workers, big.task_files, big.write_images) == (4, 1, 1)
    assert big.peak_bytes <= 16 << 30
    # in 512 MiB: one task ahead, and 2 workers of 192 MiB (4 images) beside the writer's 96
    assert plan_pipeline(4096, 10_000, None, available=512 << 20).workers == 2
    with pytest.raises(DatasetError, match=r"--workers 4 with --size 4096: each worker holds "
                                           r"about 192 MiB of 48 MiB images, and 4 need more "
                                           r"than the 512 MiB of memory available; give "
                                           r"--workers 2 or fewer"):
        plan_pipeline(4096, 10_000, 4, available=512 << 20)


def test_float_and_32_bit_integer_images_are_refused_naming_the_mode(tmp_path, capsys):
    """uint8 conversion clipped them to black or white; 16-bit PNGs stay clipped as
    torchvision does, as the docs say."""
    root = make_folder(tmp_path / "train", 2, seed=6)
    ramp = np.linspace(0, 1, 400, dtype=np.float32).reshape(20, 20)
    Image.fromarray(ramp).save(root / "circle" / "float.tif")
    Image.fromarray((ramp.astype(np.float64) * (2**31 - 1)).astype(np.int32)).save(
        root / "square" / "int32.tif")
    Image.fromarray((ramp * 65535).astype(np.uint16)).save(root / "triangle" / "deep.png")
    assert convert("--image-folder", root, "--size", SIZE, "--out", tmp_path / "d.h5") == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("skipped 2 unreadable files: ")
    assert "circle/float.tif (mode F (32-bit floating-point pixels), which 8-bit storage " \
           "would clip to black or white; convert it to 8 bits first)" in line
    assert "square/int32.tif (mode I (32-bit integer pixels)" in line
    assert inspect_dataset(tmp_path / "d.h5").train_size == 7  # the 16-bit PNG is kept
    assert convert("--image-folder", root, "--size", SIZE, "--strict",
                   "--out", tmp_path / "e.h5") == 2
    assert "float.tif is not a readable image (mode F (32-bit floating-point" in (
        capsys.readouterr().err)
