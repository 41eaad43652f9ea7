"""The reliability suite, for what the data, a checkpoint and the numeric options hold: on 2
ranks a NaN or Inf is named where it enters (file, split and sample, or tensor), and option
values outside their rule are refused, each as one line and status 2 within seconds, with no
change to any file that is not the run's own output."""

import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.data.dataset_writer import write_dataset
from tests.reliability import assert_refused, changed_outside, launch, snapshot
from tests.test_training_app import mpiexec, start, wait_for_step

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

RUN = ("--net", "smallcnn", "--batch", "32")


def small_digits(path: Path, train_value: tuple | None = None,
                 val_value: tuple | None = None) -> Path:
    """64 training and 20 held-out 1x8x8 samples of 10 classes; ``(sample, value)`` put into
    one pixel of a split afterwards (the writer refuses non-finite images)."""
    rng = np.random.default_rng(0)
    write_dataset(path, rng.random((64, 1, 8, 8)), rng.integers(0, 10, 64), 10,
                  rng.random((20, 1, 8, 8)), rng.integers(0, 10, 20), "test data")
    with h5py.File(path, "r+") as h5:
        for split, change in (("train", train_value), ("val", val_value)):
            if change is not None:
                sample, value = change
                h5[f"{split}/images"][sample, 0, 5, 6] = value
    return path


def refused(tmp_path: Path, message: str, *args: str, outputs: tuple = ()) -> None:
    """``args`` on 2 ranks: status 2, one line holding ``message``, nothing else changed."""
    (tmp_path / "cache").mkdir(exist_ok=True)  # the run's compute-time cache, made beforehand
    before = snapshot(tmp_path)
    outcome = launch(*args, cwd=tmp_path)
    assert_refused(outcome, message)
    assert "Traceback" not in outcome.stdout + outcome.stderr
    assert changed_outside(before, snapshot(tmp_path), (tmp_path / "cache", *outputs)) == []


def test_nan_in_the_training_images_is_named_not_blamed_on_the_rate(tmp_path):
    data = small_digits(tmp_path / "nan.h5", train_value=(37, np.nan))
    # 2 steps of 32 read every training sample once; the NaN lies on one rank's slab
    refused(tmp_path, f"dataset '{data}': /train/images sample 37 holds NaN", *RUN,
            "--data", str(data), "--steps", "2")


def test_inf_only_in_the_held_out_split_is_named(tmp_path):
    data = small_digits(tmp_path / "val-inf.h5", val_value=(13, -np.inf))
    refused(tmp_path, f"dataset '{data}': /val/images sample 13 holds Inf", *RUN,
            "--data", str(data), "--steps", "2")


def test_inf_in_a_checkpoint_tensor_is_named(tmp_path):
    first = launch(*RUN, "--steps", "1", "--checkpoint-dir", "ckpt", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    checkpoint = tmp_path / "ckpt" / "step-00000001.h5"
    with h5py.File(checkpoint, "r+") as h5:
        h5["params/conv2.weight"][31, 15, 2, 2] = np.inf
    refused(tmp_path, f"checkpoint {checkpoint}: tensor /params/conv2.weight holds Inf", *RUN,
            "--steps", "3", "--resume", str(checkpoint))


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_verify_refuses_a_tolerance_that_is_not_a_finite_number_at_least_0(tmp_path, value):
    refused(tmp_path, f"--tolerance {value} must be a finite number >= 0", "verify", "--net",
            "mlp", "--tolerance", value)


@pytest.mark.parametrize("data", ["synthetic", "dataset"])
def test_a_negative_seed_is_refused_alike_for_synthetic_data_and_a_dataset(tmp_path, data):
    source = str(small_digits(tmp_path / "d.h5")) if data == "dataset" else "synthetic"
    refused(tmp_path, "argument --seed: '-1' is not a seed; give an integer in [0, 2**63)",
            *RUN, "--data", source, "--steps", "2", "--seed", "-1")


def test_a_warm_up_as_long_as_the_run_is_refused(tmp_path):
    refused(tmp_path, "--warmup-steps 100 must be fewer than the run's 6 steps", *RUN,
            "--steps", "6", "--warmup-steps", "100", "--log", "run.h5",
            outputs=(tmp_path / "run.h5",))


def test_a_targets_dataset_for_a_classifier_is_refused_naming_the_fix(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "targets.h5"
    write_dataset(data, rng.random((64, 1, 8, 8)), targets=rng.uniform(-1, 1, (64, 4)))
    refused(tmp_path, f"dataset '{data}' holds 4 real-valued targets per sample but the net "
            f"classifies into 10 classes; use a net whose input line says targets=4", *RUN,
            "--data", str(data), "--steps", "2")


def test_a_labels_dataset_for_a_regression_is_refused_naming_the_fix(tmp_path):
    net = tmp_path / "regress.net"
    net.write_text("input channels=1 size=8 targets=4\nflatten\nlinear out=4\n")
    data = small_digits(tmp_path / "labels.h5")
    refused(tmp_path, f"dataset '{data}' holds class labels (10 classes) but the net regresses "
            f"4 targets", "--net", str(net), "--batch", "32", "--data", str(data),
            "--steps", "2")


def test_a_dataset_cut_short_during_training_stops_every_rank_naming_the_sample(tmp_path):
    """The issue's case: HDF5 reads what lies past the end of a shortened file as zeros, so a
    run went on to its end on zeros; now the first read that meets the cut stops every rank,
    status 2, one line naming the file and the sample."""
    rng = np.random.default_rng(0)
    data = tmp_path / "big.h5"  # 100 chunks of 64 samples: most batches meet a cut half-way
    write_dataset(data, rng.random((6400, 1, 8, 8)), rng.integers(0, 10, 6400), 10)
    (tmp_path / "cache").mkdir()
    process = start(2, *RUN, "--data", str(data), "--steps", "5000", "--print-every", "10",
                    tmp_path=tmp_path)
    try:
        wait_for_step(process, 30)
        os.truncate(data, data.stat().st_size // 2)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 2, err
    assert len(lines) == 1, err
    # whichever read meets the cut first names its array: the images, or the labels after them
    assert re.match(rf"hpctrain: error: dataset '{re.escape(str(data))}': "
                    rf"/train/(images|labels) sample \d+ cannot be read", lines[0]), err
    assert "cut short of the" in lines[0] and "Traceback" not in err
