"""Checkpoint directories (names, latest, pruning, resume paths) and header checks, serially."""

import math

import h5py
import pytest

from hpctrain.model.net import load_net
from hpctrain.run.checkpoint import (
    CheckpointError,
    checkpoint_path,
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint_info,
    resolve_resume,
    tensor_shapes,
)


def touch(directory, *names):
    for name in names:
        (directory / name).write_bytes(b"")


def test_names_sort_by_step(tmp_path):
    assert checkpoint_path(tmp_path, 120) == tmp_path / "step-00000120.h5"
    assert checkpoint_path(tmp_path, 123456789).name == "step-123456789.h5"
    names = [checkpoint_path(tmp_path, s).name for s in (7, 30, 120, 99999999)]
    assert names == sorted(names)
    with pytest.raises(ValueError, match="-1"):
        checkpoint_path(tmp_path, -1)


def test_latest_is_the_highest_complete_step(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "absent") is None
    touch(tmp_path, "step-00000020.h5", "step-00000100.h5", "step-00000003.h5",
          ".step-00000300.h5.k2j4.tmp",  # a write in progress, or a crashed one
          "step-00000400.h5.bak", "notes.txt", "step-abc.h5")
    (tmp_path / "step-00000500.h5").mkdir()  # not a file
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000100.h5"
    touch(tmp_path, "step-123456789.h5")  # more than 8 digits still counts by value
    assert latest_checkpoint(tmp_path) == tmp_path / "step-123456789.h5"


def test_prune_keeps_the_newest(tmp_path):
    steps = [2, 4, 6, 8, 10]
    touch(tmp_path, *(checkpoint_path(tmp_path, s).name for s in steps), ".step-00000012.h5.x.tmp",
          "other.h5", ".other.h5.x.tmp")
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert deleted == [checkpoint_path(tmp_path, s) for s in (2, 4, 6)]
    left = sorted(p.name for p in tmp_path.iterdir())  # a crash's temporary goes too
    assert left == [".other.h5.x.tmp", "other.h5", "step-00000008.h5", "step-00000010.h5"]
    assert prune_checkpoints(tmp_path, keep=5) == []
    assert prune_checkpoints(tmp_path / "absent", keep=1) == []
    with pytest.raises(CheckpointError, match="keep at least 1"):
        prune_checkpoints(tmp_path, keep=0)


def test_links_named_like_checkpoints_are_never_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "precious.h5"
    target.write_text("a user's file\n")
    directory = tmp_path / "run"
    directory.mkdir()
    touch(directory, "step-00000001.h5", "step-00000002.h5")
    (directory / "step-00000009.h5").symlink_to(target)
    (directory / ".step-00000010.h5.abc_12.tmp").symlink_to(target)
    assert latest_checkpoint(directory) == directory / "step-00000002.h5"
    assert prune_checkpoints(directory, keep=1) == [directory / "step-00000001.h5"]
    assert target.read_text() == "a user's file\n"
    assert sorted(p.name for p in directory.iterdir()) == [
        ".step-00000010.h5.abc_12.tmp", "step-00000002.h5", "step-00000009.h5"]


def test_resolve_resume_takes_a_file_or_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match=f"no checkpoint in {tmp_path}"):
        resolve_resume(tmp_path)
    touch(tmp_path, "step-00000001.h5", "step-00000009.h5", ".step-00000010.h5.a.tmp")
    assert resolve_resume(tmp_path) == tmp_path / "step-00000009.h5"
    assert resolve_resume(str(tmp_path)) == tmp_path / "step-00000009.h5"
    assert resolve_resume(tmp_path / "step-00000001.h5") == tmp_path / "step-00000001.h5"
    missing = tmp_path / "nope.h5"
    with pytest.raises(CheckpointError, match=f"checkpoint {missing} does not exist"):
        resolve_resume(missing)


def test_headers_are_checked_before_any_tensor(tmp_path):
    net = load_net("smallcnn")
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint_info(tmp_path / "absent.h5", net)
    (tmp_path / "text.h5").write_text("hello\n")
    with pytest.raises(CheckpointError, match="not a readable HDF5 file"):
        read_checkpoint_info(tmp_path / "text.h5", net)
    with h5py.File(tmp_path / "other.h5", "w") as h5:
        h5.attrs["format"] = "something-else"
    with pytest.raises(CheckpointError, match="other.h5 is not an hpctrain checkpoint"):
        read_checkpoint_info(tmp_path / "other.h5", net)
    with h5py.File(tmp_path / "v2.h5", "w") as h5:
        h5.attrs.update({"format": "hpctrain-checkpoint", "version": 2})
    with pytest.raises(CheckpointError, match="has version 2"):
        read_checkpoint_info(tmp_path / "v2.h5", net)
    with h5py.File(tmp_path / "damaged.h5", "w") as h5:
        h5.attrs.update({"format": "hpctrain-checkpoint", "version": 1, "step": 3})
    with pytest.raises(CheckpointError, match="damaged.h5 has a damaged header"):
        read_checkpoint_info(tmp_path / "damaged.h5", net)


def test_tensor_shapes_of_a_shipped_net():
    shapes = tensor_shapes(load_net("alexnet"))
    assert shapes["conv1.weight"] == (64, 3, 11, 11)
    assert shapes["conv1.bias"] == (64,)
    assert sum(math.prod(s) for s in shapes.values()) == load_net("alexnet").parameter_count()
