"""Training in fp32, tf32, bf16 and fp16 on the CPU: products with float32 sums, master
weights, dynamic loss scaling with skipped steps, checkpoints that resume under another
precision and plan, and held-out accuracy on the digits close to fp32's."""

import math

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import hpctrain.run.loop
from hpctrain.commands import train as train_command
from hpctrain.device.backend import make_backend
from hpctrain.device.precision import PRECISIONS, bfloat16, resolve_precision
from hpctrain.errors import UserError
from hpctrain.kernels.conv import conv_backward, conv_forward
from hpctrain.kernels.products import matmul, tf32, total
from hpctrain.model.net import load_net
from hpctrain.plan.plans import plan_from_spec
from hpctrain.run.loop import TrainConfig, train
from hpctrain.run.loss_scale import LossScale
from tests.test_training_app import DIGITS, launch

# -- precision as data ---------------------------------------------------------------------------


def test_auto_is_tf32_on_a_gpu_and_fp32_on_the_cpu_and_bad_names_are_refused():
    assert resolve_precision("auto", "gpu").name == "tf32"
    assert resolve_precision("auto", "cpu").name == "fp32"
    assert resolve_precision("float64").name == "fp64"
    bf16 = resolve_precision("bf16")
    assert (bf16.itemsize, bf16.master_itemsize, bf16.mixed) == (2, 4, True)
    assert not PRECISIONS["tf32"].mixed and PRECISIONS["fp16"].loss_scaling
    with pytest.raises(UserError, match="unknown precision 'fp8'; choose one of auto"):
        resolve_precision("fp8")


@pytest.mark.parametrize("version,refused", [("2.1.1", True), ("1.26.4", True),
                                              ("2.1.2", False), ("2.1.2rc1", False),
                                              ("2.4", False)])
def test_bf16_on_a_gpu_needs_the_numpy_cupys_bfloat16_arrays_need(monkeypatch, version, refused):
    """CuPy 14's bfloat16 arrays need NumPy 2.1.2 or later: an older one is refused at start,
    in one line that names both versions and the fix, on a GPU only (the CPU's bf16 is
    ml_dtypes' alone)."""
    monkeypatch.setattr(np, "__version__", version)
    assert resolve_precision("bf16", "cpu").name == "bf16"
    if not refused:
        assert resolve_precision("bf16", "gpu").name == "bf16"
        return
    with pytest.raises(UserError) as caught:
        resolve_precision("bf16", "gpu")
    assert "needs NumPy 2.1.2 or later" in str(caught.value)
    assert f"this is NumPy {version}" in str(caught.value) and "\n" not in str(caught.value)


def test_the_gpu_extras_are_cupy_14_for_cuda_13_and_12_with_that_numpy():
    """``pip install '.[gpu]'`` gives CUDA 13's CuPy 14 (the GPUs' image has CUDA 13), and
    ``.[gpu-cuda12]`` CUDA 12's; both the NumPy bf16 arrays need."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    for extra, cupy in (("gpu", "cupy-cuda13x>=14"), ("gpu-cuda12", "cupy-cuda12x>=14")):
        assert cupy in extras[extra] and "numpy>=2.1.2" in extras[extra], extra
        assert any(d.startswith("nvidia-cudnn-frontend") for d in extras[extra])


# -- kernels -------------------------------------------------------------------------------------


def test_tf32_rounds_to_ten_bits_of_mantissa_ties_to_even():
    a = np.array([1.0, 1 + 2**-11, 1 + 2**-10 + 2**-11, 1 + 2**-10 + 2**-12, np.inf, np.nan,
                  -3.14159265], np.float32)
    got = tf32(np, a)
    assert got[:4].tolist() == [1.0, 1.0, 1 + 2**-9, 1 + 2**-10]
    assert np.isinf(got[4]) and np.isnan(got[5])
    assert got[6] == np.float32(-3.140625)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    # every value keeps its top 10 mantissa bits and is within half a TF32 unit
    assert np.all((tf32(np, x).view(np.uint32) & 0x1FFF) == 0)
    assert np.all(np.abs(tf32(np, x) - x) <= np.abs(x) * 2.0**-11)


@pytest.mark.parametrize("dtype", [bfloat16, np.float16], ids=["bf16", "fp16"])
def test_sixteen_bit_products_and_sums_accumulate_in_float32(dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 300)).astype(dtype)
    b = rng.standard_normal((300, 5)).astype(dtype)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)
    got = matmul(np, a, b)
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)
    out = np.empty((7, 5), dtype)
    assert matmul(np, a, b, out=out) is out and np.array_equal(out, want)
    # a long sum of ones: 16-bit accumulation stalls (bf16 at 256, fp16 at 2048)
    ones = np.ones(5000, dtype)
    assert float(total(ones)) == pytest.approx(5000, rel=0.01)


@pytest.mark.parametrize("dtype", [bfloat16, np.float16], ids=["bf16", "fp16"])
def test_a_sixteen_bit_convolution_is_the_float32_one_rounded(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 8)).astype(dtype)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    pads = ((1, 0), (1, 1))
    y, cache = conv_forward(np, x, w, b, (2, 1), pads)
    y32, cache32 = conv_forward(np, x.astype(np.float32), w.astype(np.float32),
                                b.astype(np.float32), (2, 1), pads)
    assert y.dtype == np.dtype(dtype) and np.array_equal(y, y32.astype(dtype))
    dy = rng.standard_normal(y.shape).astype(dtype)
    dw_out = np.empty(w.shape, dtype)
    dx, dw, db = conv_backward(np, dy, w, cache, (2, 1), dw_out=dw_out)
    dx32, dw32, db32 = conv_backward(np, dy.astype(np.float32), w.astype(np.float32), cache32,
                                     (2, 1))
    assert dw is dw_out and np.array_equal(dw, dw32.astype(dtype))
    assert np.array_equal(dx, dx32.astype(dtype)) and np.array_equal(db, db32.astype(dtype))


# -- training ------------------------------------------------------------------------------------

def run(net_name, size, precision, steps=4, grid="1x1", batch=8, loss_scale=2.0**16, resume=None,
        checkpoint_dir=None, lr=0.05):
    net = load_net(net_name, size)
    comm = MPI.COMM_WORLD
    plan = plan_from_spec(grid, net, 1)
    backend = make_backend("cpu", precision, comm)
    config = TrainConfig(batch, steps, lr, 0.9, 5e-4, 0, 100, checkpoint_dir=checkpoint_dir,
                         loss_scale=loss_scale)
    return train(net, plan, config, backend, comm, out=lambda *_: None, resume=resume)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_each_precision_trains_close_to_float64(precision):
    """A net with batch norm, a residual add and a classifier: the losses of each precision
    stay within its rounding of float64's (bf16 has 8 bits of mantissa, fp16 11, tf32 11)."""
    exact = run("resdigits", None, "fp64").losses
    got = run("resdigits", None, precision).losses
    tolerance = {"tf32": 2e-3, "fp16": 5e-3, "bf16": 3e-2}[precision]
    assert np.allclose(got, exact, rtol=tolerance), (got, exact)
    assert got != run("resdigits", None, "fp32").losses or precision == "tf32"


@pytest.fixture
def networks(monkeypatch):
    """The networks the runs of a test build, in order."""
    built = []
    original = hpctrain.run.loop.Network

    def keep(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(hpctrain.run.loop, "Network", keep)
    return built


def test_mixed_precision_keeps_float32_master_weights_and_momentum(networks):
    run("smallcnn", 16, "bf16", steps=3)
    (network,) = networks
    for p in network.params:
        assert p.value.dtype == np.dtype(bfloat16) and p.master.dtype == np.float32
        assert np.array_equal(p.value, p.master.astype(bfloat16))  # refreshed after the update
    for b in network.buffers:  # batch norm's running statistics: float32
        assert b.value.dtype == np.float32


def test_fp16_skips_overflowed_steps_and_lowers_the_scale(networks):
    """A first scale of 2**20 makes the loss gradient (about scale/batch) overflow float16:
    steps 1 and 2 are skipped, changing no weight, and the scale halves until it fits; then the
    run learns, its losses finite."""
    scaled = run("smallcnn", 16, "fp16", steps=6, loss_scale=2.0**20)
    scaler = scaled.loss_scale
    assert scaler.skipped[:2] == [1, 2] and 3 not in scaler.skipped
    assert scaler.scale == 2.0**20 / 2 ** len(scaler.skipped)
    assert all(math.isfinite(loss) for loss in scaled.losses)
    run("smallcnn", 16, "fp16", steps=2, loss_scale=2.0**20)  # both steps skipped
    run("smallcnn", 16, "fp16", steps=0)  # the initial weights
    for skipped, initial in zip(networks[1].params, networks[2].params, strict=True):
        assert np.array_equal(skipped.master, initial.master)


def test_the_loss_scale_grows_after_clean_steps():
    scale = LossScale(8.0, growth_interval=2)
    for step in range(1, 5):
        scale.update(False, step)
    assert scale.scale == 32.0 and scale.skipped == []
    scale.update(True, 5)
    assert (scale.scale, scale.skipped, scale.clean) == (16.0, [5], 0)
    with pytest.raises(UserError, match="--loss-scale -1"):
        LossScale(-1.0)


def test_a_bf16_checkpoint_resumes_in_fp32_and_an_fp16_one_keeps_its_scale(tmp_path):
    whole = run("smallcnn", 16, "bf16", steps=4, checkpoint_dir=tmp_path / "a")
    with h5py.File(tmp_path / "a" / "step-00000004.h5") as h5:
        assert h5.attrs["precision"] == "bf16" and h5.attrs["dtype"] == "float32"
        assert h5["params/conv1.weight"].dtype == np.float32
    # the master weights, not their 16-bit copy: fp32 continues from exactly those
    later = run("smallcnn", 16, "fp32", steps=6, resume=tmp_path / "a" / "step-00000004.h5")
    assert later.first_step == 4 and len(later.losses) == 2
    assert all(math.isfinite(x) for x in later.losses) and whole.losses[-1] > 0
    run("smallcnn", 16, "fp16", steps=2, loss_scale=2.0**20, checkpoint_dir=tmp_path / "b")
    resumed = run("smallcnn", 16, "fp16", steps=3, resume=tmp_path / "b" / "step-00000002.h5")
    assert resumed.loss_scale.scale == 2.0**18  # two skipped steps, then carried on


def test_the_train_command_logs_the_precision_scale_and_skipped_steps(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--net", "smallcnn", "--image-size", "16", "--batch", "8", "--steps", "3",
            "--compute", "flops", "--threads", "1", "--precision", "fp16", "--loss-scale",
            str(2.0**20), "--log", "run.h5"]
    assert train_command.run(argv, MPI.COMM_WORLD) == 0
    out = capsys.readouterr().out
    assert "cpu float16, fp16 (float32 master weights, loss scaling)" in out
    assert "(overflow: update skipped)" in out and "updates skipped for overflow" in out
    with h5py.File(tmp_path / "run.h5") as h5:
        assert h5.attrs["precision"] == "fp16"
        assert list(h5["steps/loss_scale"][:]) == [2.0**20, 2.0**19, 2.0**18]
        assert list(h5["steps/skipped"][:2]) == [1, 1]


# -- learning: the digits on 2 ranks -------------------------------------------------------------

@pytest.mark.skipif(not DIGITS.exists(), reason="make inputs/digits.h5 first")
def test_bf16_and_fp16_learn_the_digits_within_three_points_of_fp32(tmp_path):
    accuracy = {}
    for precision in ("fp32", "bf16", "fp16"):
        result = launch(2, "--net", "smallcnn", "--data", str(DIGITS), "--batch", "64",
                        "--epochs", "2", "--lr", "0.1", "--print-every", "100", "--precision",
                        precision, "--log", f"{precision}.h5", "--compute", "flops",
                        tmp_path=tmp_path, timeout=300)
        assert result.returncode == 0, result.stderr
        with h5py.File(tmp_path / f"{precision}.h5") as h5:
            accuracy[precision] = float(h5["validation/accuracy"][-1])
    assert accuracy["fp32"] > 0.8, accuracy
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.03, accuracy
    assert abs(accuracy["fp16"] - accuracy["fp32"]) <= 0.03, accuracy
