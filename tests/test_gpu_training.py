"""``train --device gpu`` in this process through the strict CuPy stand-in: steps on synthetic
data with augmentation and overlapped gradient sums, a dataset read ahead by the prefetch
thread with held-out evaluation, and a checkpoint resumed; the stand-in computes with NumPy, so
the GPU path must give the CPU path's losses."""

import numpy as np
import pytest
from mpi4py import MPI

import hpctrain.run.loop
from hpctrain.commands import convert as convert_command
from hpctrain.commands import train as train_command
from tests.gpu_standin import TO_DEVICE, TO_HOST

COMMON = ["--net", "smallcnn", "--batch", "4", "--compute", "flops", "--threads", "1",
          "--print-every", "100"]


def train(argv, monkeypatch):
    """Run the train command in this process; the losses of its steps."""
    return trained(argv, monkeypatch).losses


def trained(argv, monkeypatch):
    """Run the train command in this process; what its training loop returned."""
    results = []
    original = hpctrain.run.loop.train

    def recording(*args, **kwargs):
        results.append(original(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(hpctrain.run.loop, "train", recording)
    assert train_command.run(argv, MPI.COMM_WORLD) == 0
    (result,) = results
    return result


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """An HDF5 dataset of 48 training and 12 held-out 1x8x8 images of 10 classes."""
    folder = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(3)
    np.savez(folder / "all.npz", x=rng.random((60, 1, 8, 8), np.float32),
             y=rng.integers(0, 10, 60))
    out = folder / "small.h5"
    assert convert_command.run(["--images", f"{folder}/all.npz:x", "--labels",
                                f"{folder}/all.npz:y", "--classes", "10", "--val-fraction", "0.2",
                                "--out", str(out)]) == 0
    return out


def test_synthetic_steps_with_augmentation_and_overlap_match_the_cpu(standin_cupy, cache,
                                                                     monkeypatch, capsys):
    argv = [*COMMON, "--steps", "3", "--image-size", "16", "--augment", "standard",
            "--overlap"]
    on_gpu = train([*argv, "--device", "gpu"], monkeypatch)
    counters = standin_cupy.counters
    assert counters.events[TO_HOST] == 3  # the loss of each step, and nothing else
    assert "gpu float32" in capsys.readouterr().out
    on_cpu = train(argv, monkeypatch)
    assert on_gpu == on_cpu


def test_a_dataset_read_ahead_evaluated_and_resumed_on_the_gpu(standin_cupy, cache, dataset,
                                                               tmp_path, monkeypatch, capsys):
    argv = [*COMMON, "--data", str(dataset), "--steps", "4", "--augment", "standard",
            "--eval-every", "2", "--prefetch", "--device", "gpu"]
    whole = train([*argv, "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2"],
                  monkeypatch)
    out = capsys.readouterr().out
    assert "validation after step 2" in out and "validation after step 4" in out
    assert standin_cupy.counters.events[TO_DEVICE] >= 8  # each step's images and labels
    resumed = train([*argv, "--resume", str(tmp_path / "ck" / "step-00000002.h5")],
                    monkeypatch)
    assert "resumed from" in capsys.readouterr().out
    assert resumed == whole[2:]
    on_cpu = train([*argv[:-2], "--device", "cpu"], monkeypatch)
    assert on_cpu == whole


def test_a_gpu_run_measures_its_peak_in_device_memory(standin_cupy, cache, monkeypatch, capsys):
    """On a GPU the host's resident set says nothing of the arrays: the measured peak is what
    CuPy's pool holds, its high-water mark, and it comes near the prediction."""
    train([*COMMON, "--steps", "2", "--image-size", "32", "--device", "gpu"], monkeypatch)
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("peak memory per rank"))
    assert "device memory CuPy's pool holds" in line, line
    measured, predicted = (float(word) for word in line.split() if word.replace(".", "").isdigit())
    assert standin_cupy.counters.peak_bytes / 2**20 == pytest.approx(measured, abs=0.05)
    assert 0.5 < predicted / measured < 2, line
