"""Host-device traffic of one training step on the GPU path, counted by the strict CuPy
stand-in on one rank (smallcnn, 16x16, batch 4): copies each way and waits for the device.

A step's count is the difference of a 4-step and a 2-step run, so set-up, the first step's
overflow watch and the closing summary cancel. The numbers are what the code does now; a change
that adds a wait or a copy to every step fails here and names the line that asked for it.
"""

import pytest
from mpi4py import MPI

from hpctrain.commands import train as train_command
from tests.gpu_standin import SCALAR, SYNC, TO_DEVICE, TO_HOST

ARGV = ["--net", "smallcnn", "--image-size", "16", "--batch", "4", "--device", "gpu",
        "--compute", "flops", "--threads", "1", "--print-every", "100"]

# per step, 3 waits, none per layer (the per-layer times are device events, read once): the
# loss totals (3 float64) to the host, which the step prints; at the step's end the timer's wait
# for its last event, then the loop's before it reads the clock (the device has caught up by
# then: that one costs nothing, but is still a call). One copy to the device: the flag of a
# non-finite input
PER_STEP = {SYNC: 2, TO_HOST: 1, SCALAR: 0, TO_DEVICE: 1}
PER_STEP_BYTES = {TO_HOST: 24, SCALAR: 0, TO_DEVICE: 8}


def counted(standin, steps):
    """(events, bytes, places) of a run of ``steps`` steps."""
    standin.counters.reset()
    assert train_command.run([*ARGV, "--steps", str(steps)], MPI.COMM_WORLD) == 0
    c = standin.counters
    return dict(c.events), dict(c.bytes), dict(c.places)


def per_step(standin):
    events2, bytes2, places2 = counted(standin, 2)
    events4, bytes4, places4 = counted(standin, 4)
    kinds = (SYNC, TO_HOST, SCALAR, TO_DEVICE)
    events = {k: (events4.get(k, 0) - events2.get(k, 0)) // 2 for k in kinds}
    nbytes = {k: (bytes4.get(k, 0) - bytes2.get(k, 0)) // 2 for k in (TO_HOST, SCALAR, TO_DEVICE)}
    places = {p: (n - places2.get(p, 0)) // 2 for p, n in places4.items() if n != places2.get(p)}
    return events, nbytes, places


@pytest.mark.parametrize("cuda_aware", [False, True], ids=["staged-mpi", "cuda-aware-mpi"])
def test_a_training_step_copies_and_waits_within_its_budget(standin_cupy, cuda_aware, tmp_path,
                                                            monkeypatch, capsys):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    if cuda_aware:
        monkeypatch.setenv("HPCTRAIN_CUDA_AWARE_MPI", "1")
        standin_cupy.counters.cuda_aware_mpi = True
    events, nbytes, places = per_step(standin_cupy)
    # on one rank every collective returns at once, so how MPI reads memory changes nothing
    assert (events, nbytes) == (PER_STEP, PER_STEP_BYTES), places


# bf16 keeps fp32's budget (its loss totals are float64 as ever); fp16 adds the overflow flag:
# one number read to the host a step, which every rank must agree on before any update
PRECISION_BUDGET = {"bf16": (PER_STEP, PER_STEP_BYTES),
                    "fp16": ({**PER_STEP, TO_HOST: 2}, {**PER_STEP_BYTES, TO_HOST: 25})}


@pytest.mark.parametrize("precision", sorted(PRECISION_BUDGET))
def test_each_precision_keeps_the_step_within_its_budget(standin_cupy, precision, tmp_path,
                                                         monkeypatch, capsys):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("tests.test_gpu_budget.ARGV", [*ARGV, "--precision", precision])
    events, nbytes, places = per_step(standin_cupy)
    assert (events, nbytes) == PRECISION_BUDGET[precision], places
