"""The reliability suite, memory: a plan that cannot fit is refused on 2 ranks before anything is
allocated or timed: one line naming the largest consumer, exit 2, within seconds, no file
changed but the run's own."""

import pytest

from tests.reliability import assert_refused, changed_outside, launch, snapshot
from tests.test_training_app import mpiexec

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def _refused(tmp_path, *args: str, message: str) -> None:
    (tmp_path / "keep.txt").write_text("a user's file\n")
    before = snapshot(tmp_path)
    outcome = launch(*args, "--steps", "1", cwd=tmp_path)
    assert_refused(outcome, message)
    assert "Traceback" not in outcome.stderr + outcome.stdout
    assert changed_outside(before, snapshot(tmp_path), (tmp_path / "cache",)) == []


def test_an_absurd_image_size_is_refused_naming_the_largest_consumer(tmp_path):
    _refused(tmp_path, "--image-size", "100000", message="fc6 parameters alone takes")


def test_an_absurd_linear_layer_is_refused_naming_it(tmp_path):
    net = tmp_path / "big.net"
    net.write_text("input channels=3 size=8 classes=10\nflatten\n"
                   "linear name=big out=100000000\nlinear name=out out=10\n")
    _refused(tmp_path, "--net", str(net), message="big parameters alone takes")


def test_a_grid_over_mem_per_rank_is_refused(tmp_path):
    _refused(tmp_path, "--mem-per-rank", "1M", "--grid", "2x1",
             message="but --mem-per-rank is 1 MiB; input random numbers alone takes")


def test_grid_auto_under_a_tiny_cap_is_refused_before_timing(tmp_path):
    _refused(tmp_path, "--mem-per-rank", "1M", "--grid", "auto",
             message="no plan fits in --mem-per-rank = 1 MiB per rank")
