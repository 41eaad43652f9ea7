"""The optimizers on whole tensors in one process against PyTorch (float64, three steps):
``torch.optim.SGD``, ``torch.optim.AdamW``, LARS and LAMB from the papers' formulas
(tests/optimizer_reference.py), each with ``clip_grad_norm_`` and with norm and bias parameters
spared; the first-copy rule the norms are summed by; the state under a mixed precision; the
refusals. The same under every plan on 1–4 ranks: tests/mpi/test_optimizers.py."""

import itertools

import numpy as np
import pytest

from hpctrain.device.precision import bfloat16
from hpctrain.errors import UserError
from hpctrain.layers.base import Parameter
from hpctrain.layout.layout import Layout, Split
from hpctrain.layout.reduction import InputSplit
from hpctrain.run.optimizer import (
    OPTIMIZERS,
    OptimizerSettings,
    make_optimizer,
)

SHAPES = {"fc.weight": (4, 5), "fc.bias": (4,), "bn.gamma": (3,), "conv.weight": (3, 2, 2, 2)}


def tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}


def gradients(step):
    rng = np.random.default_rng(100 + step)
    return {name: rng.standard_normal(shape) * 0.3 for name, shape in SHAPES.items()}


@pytest.mark.parametrize("case", [
    "sgd", "sgd-clip", "sgd-spared", "adamw", "adamw-clip-spared", "lars", "lars-clip-spared",
    "lamb", "lamb-clip-spared-nobc"])
def test_three_steps_match_pytorch(case):
    torch = pytest.importorskip("torch")
    from tests.optimizer_reference import RECIPES, torch_optimizer, torch_step

    recipe = RECIPES[case]
    start = tensors()
    params = [Parameter(name, value.copy(), value.shape) for name, value in start.items()]
    ours = recipe.hpctrain(params)
    named = [(name, torch.nn.Parameter(torch.from_numpy(value.copy())))
             for name, value in start.items()]
    theirs = torch_optimizer(recipe, named)
    for step in range(3):
        grads = gradients(step)
        for p in params:
            p.grad = grads[p.name].copy()
        for name, p in named:
            p.grad = torch.from_numpy(grads[name].copy())
        norm = torch_step(recipe, theirs, [p for _, p in named])
        ours.step()
        if recipe.clip is not None:
            assert ours.grad_norm == pytest.approx(norm, rel=1e-13)
            assert norm > recipe.clip  # the clipping really scales
        for p, (_, q) in zip(params, named, strict=True):
            np.testing.assert_allclose(p.value, q.detach().numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"{case} step {step + 1} {p.name}")
    assert ours.steps == 3


def test_each_optimizer_differs_from_the_others():
    """The comparison tells the optimizers (and a spared bias) apart."""
    finals = {}
    for name, spared in itertools.product(OPTIMIZERS, (False, True)):
        params = [Parameter(n, v.copy(), v.shape) for n, v in tensors().items()]
        optimizer = make_optimizer(params, 0.05, 0.9, 0.1,
                                   OptimizerSettings(name, decay_norm_bias=not spared))
        for step in range(2):
            for p in params:
                p.grad = gradients(step)[p.name].copy()
            optimizer.step()
        finals[name, spared] = np.concatenate([p.value.ravel() for p in params])
    for a, b in itertools.combinations(finals, 2):
        assert not np.allclose(finals[a], finals[b]), (a, b)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_stays_float32_under_bf16(name):
    """Master weights in float32, 16-bit gradients and copy: the state is float32 and the copy
    is the master rounded."""
    rng = np.random.default_rng(1)
    master = rng.standard_normal((6, 3)).astype(np.float32)
    p = Parameter("fc.weight", master.astype(bfloat16), master.shape, master=master.copy())
    optimizer = make_optimizer([p], 0.01, 0.9, 0.01,
                               OptimizerSettings(name, clip=1.0))
    for _ in range(2):
        p.grad = (rng.standard_normal((6, 3)) * 256).astype(bfloat16)
        optimizer.step(unscale=1 / 256)
    for values in optimizer.state.values():
        assert values[0].dtype == np.float32
    assert np.array_equal(p.value, p.master.astype(bfloat16))
    assert np.isfinite(optimizer.grad_norm)


def test_per_bucket_updates_need_an_element_wise_optimizer():
    p = Parameter("w", np.ones((2, 2)), (2, 2))
    adamw = make_optimizer([p], 0.1, 0.9, 0.0, OptimizerSettings("adamw"))
    p.grad = np.ones((2, 2))
    with pytest.raises(RuntimeError, match="during_backward"):  # t = 0: no bias correction
        adamw.step(0.1, [p])
    assert adamw.during_backward(0.1) and adamw.steps == 1
    for settings in (OptimizerSettings("lars"), OptimizerSettings("lamb"),
                     OptimizerSettings("sgd", clip=1.0)):
        optimizer = make_optimizer([p], 0.1, 0.9, 0.0, settings)
        assert optimizer.during_backward(0.1) is None
        p.grad = np.ones((2, 2))
        with pytest.raises(RuntimeError):
            optimizer.step(0.1, [p])


@pytest.mark.parametrize("settings, fragment", [
    (OptimizerSettings("adam"), "--optimizer adam"),
    (OptimizerSettings("adamw", betas=(0.9, 1.0)), "--betas 0.9,1"),
    (OptimizerSettings("lamb", eps=0.0), "--eps 0"),
    (OptimizerSettings("lars", trust=-1.0), "--trust-coefficient -1"),
    (OptimizerSettings("sgd", clip=0.0), "--clip-grad-norm 0"),
    (OptimizerSettings("sgd", clip=float("inf")), "--clip-grad-norm inf"),
])
def test_bad_settings_are_refused_by_name(settings, fragment):
    with pytest.raises(UserError, match=fragment):
        make_optimizer([Parameter("w", np.ones(2), (2,))], 0.1, 0.9, 0.0, settings)


# -- the first copy of each block: what the norms sum --------------------------------------

def layouts():
    """Layouts of parameters as layers make them: channel cuts on meshes with batch, spatial
    and replica digits, on groups of ranks, and a weight cut along its input channels."""
    image = (8, 6, 8, 8)
    found = []
    for procs, first, world in ((4, 0, 4), (6, 0, 6), (2, 2, 6), (4, 2, 8)):
        for split in (Split((procs, 1, 1, 1)), Split((1, procs, 1, 1)),
                      Split((procs // 2, 2, 1, 1)), Split((1, 2, procs // 2, 1)),
                      Split((1, 1, 2, 1), procs // 2)):
            found.append(("sharded_by", Layout.of_split(image, split).on_ranks(first, world)))
    x = Layout.of_split((8, 12), Split((1, 2), inputs=2))
    y = Layout.of_split((8, 20), Split((1, 2), inputs=2), cut=(1,))
    found.append(("layout", InputSplit.of(x, y, (20, 12)).weight))
    found.append(("layout", InputSplit.of(x, y, (20, 12)).bias))
    return found


@pytest.mark.parametrize("kind, layout", layouts(), ids=lambda v: str(v))
def test_first_copies_count_every_entry_once(kind, layout):
    """Brute force over the ranks (a test may loop over them; the rule never does): the first
    copies are the lowest ranks holding each block, and their blocks tile the tensor."""
    shape = layout.shape if kind == "layout" else (6, 3, 3)
    param = (Parameter("w", None, shape, layout=layout) if kind == "layout"
             else Parameter("w", None, shape, sharded_by=layout))
    counts = np.zeros(shape, int)
    seen = set()
    for rank in range(layout.procs):
        box = param.box(rank)
        empty = any(lo == hi for lo, hi in box)
        lowest = not empty and box not in seen
        seen.add(box)
        assert param.holds_first_copy(rank) == lowest, (rank, box)
        if lowest:
            counts[tuple(slice(lo, hi) for lo, hi in box)] += 1
    assert (counts == 1).all()


def test_memory_counts_each_optimizers_state():
    from hpctrain.cost.memory import OPTIMIZER_STATE, parameter_bytes
    from hpctrain.device.precision import PRECISIONS

    for name, optimizer in OPTIMIZERS.items():
        assert OPTIMIZER_STATE[name] == optimizer.state_names
    fp32 = PRECISIONS["fp32"]
    sgd, adamw = parameter_bytes(10, fp32), parameter_bytes(10, fp32, "adamw")
    assert sgd == parameter_bytes(10, fp32, "lars")
    assert sum(adamw.values()) - sum(sgd.values()) == 40  # a second moment of 10 floats
    assert adamw == parameter_bytes(10, fp32, "lamb")
    bf16 = parameter_bytes(10, PRECISIONS["bf16"], "adamw")
    assert bf16["exp_avg"] == bf16["exp_avg_sq"] == 40  # float32 state


# -- the train command ---------------------------------------------------------------------

def train(tmp_path, *flags):
    from mpi4py import MPI

    from hpctrain.commands import train as train_command

    argv = ["--net", "mlp", "--batch", "8", "--steps", "2", "--compute", "flops",
            "--threads", "1", *flags]
    assert train_command.run(argv, MPI.COMM_WORLD) == 0


def test_the_log_keeps_the_norm_before_clipping_unscaled_under_fp16(tmp_path, monkeypatch,
                                                                     capsys):
    """The norm is of the unscaled gradients: fp16's (scaled by 2**16 while summed) is fp32's
    to float16's rounding; a step that overflowed logs none."""
    import h5py

    monkeypatch.chdir(tmp_path)
    norms = {}
    for precision in ("fp32", "fp16"):
        train(tmp_path, "--optimizer", "lars", "--clip-grad-norm", "0.5", "--precision",
              precision, "--log", f"{precision}.h5")
        with h5py.File(tmp_path / f"{precision}.h5") as h5:
            norms[precision] = h5["steps/grad_norm"][:]
    assert "grad norm 0.76" in capsys.readouterr().out
    assert norms["fp32"][0] > 0.5  # clipped
    np.testing.assert_allclose(norms["fp16"], norms["fp32"], rtol=1e-3)
    train(tmp_path, "--precision", "fp16", "--loss-scale", str(2.0**40), "--clip-grad-norm",
          "1", "--log", "over.h5")
    with h5py.File(tmp_path / "over.h5") as h5:
        skipped, norm = h5["steps/skipped"][:], h5["steps/grad_norm"][:]
    assert skipped[0] == 1 and np.isnan(norm[0])
    train(tmp_path, "--log", "plain.h5")
    with h5py.File(tmp_path / "plain.h5") as h5:
        assert np.isnan(h5["steps/grad_norm"][:]).all()  # no clipping: no norm


@pytest.mark.parametrize("flags, fragment", [
    (["--optimizer", "adamw", "--momentum", "0.5"],
     "--momentum is for --optimizer sgd or lars, not --optimizer adamw"),
    (["--trust-coefficient", "0.01"], "--trust-coefficient is for --optimizer lars"),
    (["--optimizer", "adamw", "--no-bias-correction"], "--no-bias-correction is for "
                                                        "--optimizer lamb"),
    (["--betas", "0.9,0.99"], "--betas is for --optimizer adamw or lamb"),
    (["--optimizer", "lamb", "--eps", "-1"], "--eps -1 must be positive"),
    (["--clip-grad-norm", "-2"], "--clip-grad-norm -2 must be a positive number"),
])
def test_flags_an_optimizer_cannot_use_are_refused(tmp_path, monkeypatch, flags, fragment):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=fragment):
        train(tmp_path, *flags)


def test_a_resume_with_another_optimizer_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tmp_path, "--optimizer", "adamw", "--checkpoint-dir", "ck")
    with pytest.raises(UserError, match="written with --optimizer adamw, not lamb"):
        train(tmp_path, "--optimizer", "lamb", "--checkpoint-dir", "ck", "--resume",
              "--steps", "3")
    train(tmp_path, "--optimizer", "adamw", "--checkpoint-dir", "ck", "--resume", "--steps", "3")


def test_an_sgd_checkpoint_of_before_other_optimizers_still_resumes(tmp_path, monkeypatch):
    """A checkpoint without the optimizer's attributes is SGD's, its updates as many as its
    steps; another optimizer is refused."""
    import h5py

    monkeypatch.chdir(tmp_path)
    train(tmp_path, "--checkpoint-dir", "ck")
    with h5py.File(tmp_path / "ck" / "step-00000002.h5", "a") as h5:
        assert (h5.attrs["optimizer"], h5.attrs["optimizer_steps"]) == ("sgd", 2)
        del h5.attrs["optimizer"], h5.attrs["optimizer_steps"]
    with pytest.raises(UserError, match="written with --optimizer sgd, not lars"):
        train(tmp_path, "--optimizer", "lars", "--checkpoint-dir", "ck", "--resume",
              "--steps", "3")
    train(tmp_path, "--checkpoint-dir", "ck", "--resume", "--steps", "3")
    with h5py.File(tmp_path / "ck" / "step-00000003.h5") as h5:
        assert (h5.attrs["optimizer"], h5.attrs["optimizer_steps"]) == ("sgd", 3)


def test_adamw_resumes_under_another_precision_from_its_float32_state(tmp_path, monkeypatch):
    """bf16 keeps float32 moments; a resume under fp64 reads them whole and counts on."""
    import h5py

    monkeypatch.chdir(tmp_path)
    train(tmp_path, "--optimizer", "adamw", "--precision", "bf16", "--checkpoint-dir", "ck")
    with h5py.File(tmp_path / "ck" / "step-00000002.h5") as h5:
        moment = h5["exp_avg/linear1.weight"]
        assert moment.dtype == np.float32 and np.abs(moment[...]).max() > 0
    train(tmp_path, "--optimizer", "adamw", "--precision", "fp64", "--checkpoint-dir", "ck",
          "--resume", "--steps", "3")
    with h5py.File(tmp_path / "ck" / "step-00000003.h5") as h5:
        assert h5.attrs["optimizer_steps"] == 3 and h5["exp_avg_sq/linear1.weight"].dtype == \
            np.float64


@pytest.mark.parametrize("case", ["sgd-clip", "adamw-clip-spared", "lars", "lars-clip-spared",
                                  "lamb-clip-spared-nobc"])
def test_on_the_cupy_stand_in_the_same_numbers_and_one_wait_per_norm(standin_cupy, case):
    """On (a strict stand-in of) CuPy: what NumPy gives, and the host waits only to read the
    norms, once per all-reduce of them (LARS with clipping: the clip's, then the weights')."""
    pytest.importorskip("torch")
    from tests.optimizer_reference import RECIPES

    cp, recipe = standin_cupy, RECIPES[case]
    finals = []
    for xp in (np, cp):
        params = [Parameter(n, xp.asarray(v), v.shape) for n, v in tensors().items()]
        optimizer = recipe.hpctrain(params)
        for step in range(3):
            for p in params:
                p.grad = xp.asarray(gradients(step)[p.name])
            cp.counters.reset()
            optimizer.step()
            if xp is cp:
                norms = (recipe.clip is not None) + (recipe.name in ("lars", "lamb"))
                assert cp.counters.waits() == norms, cp.counters.places
        finals.append([cp.asnumpy(p.value) if xp is cp else p.value for p in params])
    for ours, numpy in zip(*finals[::-1], strict=True):
        np.testing.assert_allclose(ours, numpy, rtol=1e-13)
