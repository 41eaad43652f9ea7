"""Checkpoints: save under one plan, resume under any plan and any P, exactly where it stopped."""

import os
import shutil

import h5py
import numpy as np
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.commands.verify import serial_plan
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import make_backend
from hpctrain.errors import OutputError
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.plans import plan_from_spec
from hpctrain.run import checkpoint
from hpctrain.run.checkpoint import (
    load_checkpoint,
    read_checkpoint_info,
    save_checkpoint,
    tensor_shapes,
)
from hpctrain.run.network import Network
from hpctrain.run.optimizer import SGD
from tests.grouped_plans import grouped_plan
from tests.mpi.helpers import all_agree, check_close, raises_everywhere
from tests.mpi.test_training import BATCH, NET, mixed_plans

SEED = 5
STATE = {"lr": 0.05, "note": "test"}


class Run:
    """A network, its data and its SGD under ``plan`` on ``grids``, trained step by step."""

    def __init__(self, net, plan, grids, dtype="float64"):
        self.comm = grids.world
        self.backend = make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), dtype)
        self.network = Network(net, plan, BATCH, grids, self.backend, seed=SEED)
        self.data = SyntheticData(self.backend, net.input_shape, net.classes, BATCH, seed=SEED)
        self.optimizer = SGD(self.network.params, lr=0.05, momentum=0.9, weight_decay=1e-3)

    def train(self, steps):
        losses = []
        for step in steps:
            losses.append(self.network.train_step(self.data, step)[0])
            self.optimizer.step()
        return losses

    def save(self, path, step):
        save_checkpoint(path, self.network, self.optimizer, step, STATE, self.comm, seed=SEED)

    def load(self, path):
        return load_checkpoint(path, self.network, self.optimizer)

    def gathered(self, velocity=False):
        """Whole parameters (or velocities) on rank 0 of this run's comm, None elsewhere."""
        tensors = self.optimizer.velocity if velocity else [p.value for p in self.network.params]
        return [gather_to_root(self.backend, self.comm, t, p.shape, p.box, "copy")
                for t, p in zip(tensors, self.network.params)]


def saved_and_resumed(comm, net, first_plan, then, path, state):
    """Two steps under ``first_plan``, saved to ``path``, then resumed under ``then`` for steps
    2 and 3: their losses, and ``state(run)`` after them."""
    with GridSet(comm) as grids:
        first = Run(net, first_plan, grids)
        first.train(range(2))
        first.save(path, 2)
    with GridSet(comm) as grids:
        run = Run(net, then, grids)
        run.load(path)
        return run.train(range(2, 4)), state(run)


def straight_run(comm, plan, steps=4):
    with GridSet(comm) as grids:
        run = Run(NET, plan, grids)
        return run.train(range(steps)), run.gathered()


def serial_reference(comm):
    """Rank 0: four straight steps on one process; elsewhere None."""
    if comm.Get_rank() != 0:
        return None
    return straight_run(MPI.COMM_SELF, serial_plan(mixed_plans(1)[0]))


def exactly_equal(comm, got, want) -> bool:
    ok = True
    if comm.Get_rank() == 0:
        ok = len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    return all_agree(comm, ok)


def test_tensor_shapes_match_the_network(comm):
    with GridSet(comm) as grids:
        for plan in mixed_plans(comm.Get_size()):
            run = Run(NET, plan, grids)
            assert tensor_shapes(NET) == {p.name: p.shape for p in run.network.params}


def test_resume_on_the_same_plan_is_bit_identical(comm, shared_dir):
    for plan in mixed_plans(comm.Get_size()):
        want_losses, want_params = straight_run(comm, plan)
        path = shared_dir / "step-2.h5"
        with GridSet(comm) as grids:
            first = Run(NET, plan, grids)
            losses = first.train(range(2))
            first.save(path, 2)
        with GridSet(comm) as grids:
            resumed = Run(NET, plan, grids)  # fresh: its own initial weights, no velocity
            info = resumed.load(path)
            assert (info.step, info.seed, info.state) == (2, SEED, STATE)
            losses += resumed.train(range(info.step, 4))
            params = resumed.gathered()
        assert losses == want_losses  # every rank holds the all-reduced losses
        assert exactly_equal(comm, params, want_params)


def test_resume_on_another_plan_and_another_p(comm, shared_dir):
    plans = mixed_plans(comm.Get_size())
    reference = serial_reference(comm)
    path = shared_dir / "step-2.h5"
    with GridSet(comm) as grids:
        Run(NET, plans[0], grids).save(path, 0)  # overwritten below: replacing works
        first = Run(NET, plans[0], grids)
        first.train(range(2))
        first.save(path, 2)
    with GridSet(comm) as grids:  # (a) another plan on all ranks
        run = Run(NET, plans[-1], grids)
        run.load(path)
        losses, params = run.train(range(2, 4)), run.gathered()
    want = reference and reference[0][2:]
    check_close(comm, np.array(losses), want and np.array(want), "losses on another plan", 1e-9)
    for k, got in enumerate(params):
        check_close(comm, got, reference and reference[1][k], f"param {k}, another plan", 1e-9)
    serial = None
    if comm.Get_rank() == 0:  # (b) one process, from the file the P ranks wrote
        with GridSet(MPI.COMM_SELF) as grids:
            run = Run(NET, serial_plan(plans[0]), grids)
            run.load(path)
            serial = run.train(range(2, 4)), run.gathered()
    check_close(comm, serial and np.array(serial[0]), want and np.array(want),
                "losses on one process", 1e-9)
    for k in range(len(params)):
        check_close(comm, serial and serial[1][k], reference and reference[1][k],
                    f"param {k} on one process", 1e-9)


def test_weight_blocks_of_an_input_split_save_and_resume_under_another_plan(comm, shared_dir):
    """Saved under input splits (each rank an out × in block of the weights, the bias added
    after the sum), resumed under a 1.5D plan, and the other way round: the losses and
    parameters of four straight steps on one process."""
    p = comm.Get_size()
    # conv1 has 2 input channels: on 3 and 4 ranks it runs model, as /model asks
    split = plan_from_spec(f"conv=i{p}/model,fc=s{p}" if p > 1 else "1x1", NET, p)
    reference = serial_reference(comm)
    want = reference and reference[0][2:]
    for first_plan, then in ((split, mixed_plans(p)[0]), (mixed_plans(p)[0], split)):
        losses, params = saved_and_resumed(comm, NET, first_plan, then,
                                           shared_dir / "step-2.h5", Run.gathered)
        check_close(comm, np.array(losses), want and np.array(want), "losses", 1e-9)
        for k, got in enumerate(params):
            check_close(comm, got, reference and reference[1][k], f"param {k}", 1e-9)


def test_the_file_holds_whole_tensors(comm, shared_dir):
    path = shared_dir / "step-3.h5"
    plans = mixed_plans(comm.Get_size())
    with GridSet(comm) as grids:
        run = Run(NET, plans[-1], grids)
        run.save(shared_dir / "step-0.h5", 0)  # before any step: no velocity yet
        run.train(range(3))
        run.save(path, 3)
        params, velocities = run.gathered(), run.gathered(velocity=True)
        names = [p.name for p in run.network.params]
        plan_text = "".join(f"{l.name} {p.describe()}\n" for l, p in zip(NET.layers, plans[-1]))
    ok = True
    if comm.Get_rank() == 0:
        with h5py.File(path, "r") as h5:
            ok &= sorted(h5["params"]) == sorted(names) == sorted(h5["momentum"])
            ok &= all(np.array_equal(h5["params"][n][...], params[k]) for k, n in enumerate(names))
            ok &= all(np.array_equal(h5["momentum"][n][...], velocities[k])
                      for k, n in enumerate(names))
            ok &= all(h5["params"][n].dtype == np.float64 for n in names)
            attrs = dict(h5.attrs)
            ok &= attrs["format"] == "hpctrain-checkpoint" and attrs["version"] == 1
            ok &= (attrs["net"], attrs["step"], attrs["seed"], attrs["dtype"]) == (
                "mixed", 3, SEED, "float64")
            ok &= list(attrs["layers"]) == [f"{l.name} {l.kind}" for l in NET.layers]
            ok &= attrs["plan"] == plan_text
        with h5py.File(shared_dir / "step-0.h5", "r") as h5:
            ok &= all(not h5["momentum"][n][...].any() for n in names)
    assert all_agree(comm, ok)


def test_a_checkpoint_taken_before_any_step_resumes_exactly(comm, shared_dir):
    plan = mixed_plans(comm.Get_size())[0]
    want_losses, want_params = straight_run(comm, plan, steps=2)
    with GridSet(comm) as grids:
        Run(NET, plan, grids).save(shared_dir / "step-0.h5", 0)
        run = Run(NET, plan, grids)
        for p in run.network.params:  # prove the load, not the init, sets them
            p.value[...] = 0
        run.load(shared_dir / "step-0.h5")  # zero velocity: μ·0 + g == g
        losses, params = run.train(range(2)), run.gathered()
    assert losses == want_losses
    assert exactly_equal(comm, params, want_params)


def test_float32_is_stored_as_float32_and_loads_into_either_dtype(comm, shared_dir):
    path = shared_dir / "step-1.h5"
    plans = mixed_plans(comm.Get_size())
    with GridSet(comm) as grids:
        run = Run(NET, plans[0], grids, "float32")
        run.train(range(1))
        run.save(path, 1)
        want = run.gathered()
        single, double = Run(NET, plans[-1], grids, "float32"), Run(NET, plans[-1], grids)
        assert single.load(path).dtype == double.load(path).dtype == "float32"
        assert all(p.value.dtype == np.float64 for p in double.network.params)
        assert exactly_equal(comm, single.gathered(), want)
        assert exactly_equal(comm, double.gathered(), want)  # float32 values, exactly
    ok = True
    if comm.Get_rank() == 0:
        with h5py.File(path, "r") as h5:
            ok = all(d.dtype == np.float32 for g in ("params", "momentum") for d in h5[g].values())
    assert all_agree(comm, ok)


def test_bad_checkpoints_are_refused_on_every_rank(comm, shared_dir):
    p = comm.Get_size()
    good, truncated, text = (shared_dir / n for n in ("good.h5", "truncated.h5", "text.h5"))
    wrong_shape, no_format = shared_dir / "wrong-shape.h5", shared_dir / "no-format.h5"
    other_net = shared_dir / "smallcnn.h5"
    small = load_net("smallcnn").with_image_size(12)
    with GridSet(comm) as grids:
        Run(NET, mixed_plans(p)[0], grids).save(good, 1)
        Run(small, plan_from_spec(f"1x{p}", small, p), grids).save(other_net, 1)
    if comm.Get_rank() == 0:
        data = good.read_bytes()
        truncated.write_bytes(data[: len(data) // 2])
        text.write_text("not a checkpoint\n")
        shutil.copy(good, wrong_shape)
        with h5py.File(wrong_shape, "r+") as h5:
            del h5["params/conv1.weight"]
            h5["params/conv1.weight"] = np.zeros((6, 2, 5, 5))
        shutil.copy(good, no_format)
        with h5py.File(no_format, "r+") as h5:
            del h5.attrs["format"]
        for name, tensor, value in (("inf.h5", "params/conv1.weight", np.inf),
                                    ("nan.h5", "momentum/linear2.bias", np.nan)):
            shutil.copy(good, shared_dir / name)  # one entry: in one rank's block only
            with h5py.File(shared_dir / name, "r+") as h5:
                h5[tensor][(-1,) * h5[tensor].ndim] = value
    comm.Barrier()
    reordered = parse_net(
        "input channels=2 size=12 classes=5\nconv out=6 kernel=3 pad=1\nrelu\nmaxpool kernel=2\n"
        "conv out=7 kernel=3 pad=1\nrelu\nmaxpool kernel=3 stride=2 pad=1\nflatten\n"
        "linear out=11\nrelu\nlinear out=5\n", "mixed")  # NET without its dropout
    with GridSet(comm) as grids:
        run = Run(NET, mixed_plans(p)[-1], grids)
        missing = shared_dir / "missing.h5"
        raises_everywhere(comm, lambda: run.load(missing), missing, "does not exist")
        raises_everywhere(comm, lambda: run.load(truncated), truncated, "HDF5")
        raises_everywhere(comm, lambda: run.load(text), text, "HDF5")
        raises_everywhere(comm, lambda: run.load(no_format), no_format, "not an hpctrain")
        raises_everywhere(comm, lambda: run.load(other_net), other_net,
                          "written for net smallcnn, not mixed")
        raises_everywhere(comm, lambda: run.load(wrong_shape), wrong_shape,
                          "/params/conv1.weight", "(6, 2, 5, 5)", "(6, 2, 3, 3)")
        for name, what in (("inf.h5", "tensor /params/conv1.weight holds Inf"),
                           ("nan.h5", "tensor /momentum/linear2.bias holds NaN")):
            raises_everywhere(comm, lambda n=name: run.load(shared_dir / n), shared_dir / name,
                              what, "resume from an earlier checkpoint")
        raises_everywhere(comm, lambda: read_checkpoint_info(good, reordered), good,
                          "layer 8 is 'dropout1 dropout' there but 'linear1 linear' here")
        raises_everywhere(comm, lambda: read_checkpoint_info(other_net, NET), other_net,
                          "written for net smallcnn, not mixed")
        assert read_checkpoint_info(good, NET).step == 1


def test_a_failed_write_leaves_the_old_checkpoint(comm, shared_dir, monkeypatch):
    """Rank 0 fails midway: every rank raises OutputError, none hangs, the old file stays."""
    path = shared_dir / "step-00000002.h5"
    with GridSet(comm) as grids:
        run = Run(NET, mixed_plans(comm.Get_size())[0], grids)
        run.train(range(2))
        run.save(path, 2)
        saved = run.gathered()
        run.train(range(2, 3))
        if comm.Get_rank() == 0:
            written = []
            real = checkpoint._write_tensor

            def fail_on_the_third(h5, name, whole, dtype):
                if len(written) == 2:
                    raise OSError("No space left on device (simulated)")
                written.append(name)
                real(h5, name, whole, dtype)

            monkeypatch.setattr(checkpoint, "_write_tensor", fail_on_the_third)
        raises_everywhere(comm, lambda: run.save(path, 3), path, "No space left on device",
                          error=OutputError)
        monkeypatch.undo()
        assert sorted(f.name for f in shared_dir.iterdir()) == [path.name]  # no temp file left
        fresh = Run(NET, mixed_plans(comm.Get_size())[-1], grids)
        assert fresh.load(path).step == 2
        assert exactly_equal(comm, fresh.gathered(), saved)
        run.save(path, 3)  # and the next save works
        assert read_checkpoint_info(path, NET).step == 3


def test_batch_norm_statistics_resume_on_another_plan_and_another_p(comm, shared_dir):
    """resdigits (residual adds, batch norm): running statistics are saved whole with the
    parameters, so training resumed on another plan or on one process goes on exactly."""
    net, procs = load_net("resdigits"), comm.Get_size()
    first_plan = plan_from_spec(f"{procs}x1", net, procs)
    other_plan = plan_from_spec(f"conv=domain:{procs}x1,fc=1x{procs}", net, procs)

    tensors = resumes_as_one_process(comm, net, first_plan, other_plan,
                                     shared_dir / "resdigits-step-2.h5")
    assert len(tensors) == len(net.param_shapes()) + len(net.buffer_shapes()) > 0


def test_a_bf16_run_resumes_in_fp32_under_another_plan_from_its_master_weights(comm,
                                                                              shared_dir):
    """A bf16 run saves its float32 master weights and momentum; an fp32 run under another plan
    loads exactly those (not their 16-bit copy) and goes on as an fp32 run saved there would."""
    plans = mixed_plans(comm.Get_size())
    path = shared_dir / "bf16.h5"
    with GridSet(comm) as grids:
        first = Run(NET, plans[0], grids, dtype="bf16")
        first.train(range(2))
        first.save(path, 2)
        masters = [gather_to_root(first.backend, comm, p.master, p.shape, p.box, "copy")
                   for p in first.network.params]
    with h5py.File(path, "r") as h5:
        assert h5.attrs["precision"] == "bf16"
        saved = [h5[f"params/{p.name}"][...] for p in first.network.params]
    if comm.Get_rank() == 0:  # the 16-bit copy rounds: the master weights are what was saved
        assert all(np.array_equal(m.astype(np.float32), s) for m, s in zip(masters, saved))
    with GridSet(comm) as grids:
        resumed = Run(NET, plans[-1], grids, dtype="fp32")
        resumed.load(path)
        loaded = resumed.gathered()
        losses = resumed.train(range(2, 4))
    if comm.Get_rank() == 0:
        assert all(np.array_equal(a, s) for a, s in zip(loaded, saved))
    assert all(np.isfinite(losses))


def test_branches_on_groups_save_and_resume_under_another_plan(comm, shared_dir):
    """resdigits with its downsampling block's main path and shortcut on different groups of
    ranks (each rank holding the other group's tensors as empty blocks): saved under it and
    resumed on every rank, and the other way round, exactly as on one process."""
    net, procs = load_net("resdigits"), comm.Get_size()
    if procs == 1:
        return  # groups need two ranks
    grouped = grouped_plan(net, procs, BATCH)
    assert any(entry.ranks for entry in grouped)
    other = plan_from_spec(f"1x{procs}", net, procs)

    for first_plan, then in ((grouped, other), (other, grouped)):
        resumes_as_one_process(comm, net, first_plan, then, shared_dir / "grouped-step-2.h5")


def whole_state(run):
    """Every parameter and buffer of ``run``, whole on rank 0 (None elsewhere)."""
    tensors = [(p.value, p) for p in run.network.params + run.network.buffers]
    return [gather_to_root(run.backend, run.comm, t, p.shape, p.box, "copy")
            for t, p in tensors]


def resumes_as_one_process(comm, net, first_plan, then, path):
    """Two steps under ``first_plan``, saved, two more under ``then``: the losses and every
    tensor as four steps on one process (under ``first_plan``'s serial form). Returns the
    tensors."""
    reference = None
    if comm.Get_rank() == 0:
        with GridSet(MPI.COMM_SELF) as grids:
            run = Run(net, serial_plan(first_plan), grids)
            reference = run.train(range(4)), whole_state(run)
    losses, tensors = saved_and_resumed(comm, net, first_plan, then, path, whole_state)
    check_close(comm, np.array(losses), reference and np.array(reference[0][2:]), "losses",
                1e-9)
    for k, got in enumerate(tensors):
        check_close(comm, got, reference and reference[1][k], f"tensor {k}", 1e-9)
    return tensors
