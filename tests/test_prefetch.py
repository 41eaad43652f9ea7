"""Reading one step ahead (hpctrain.data.prefetch): the same numbers as the source read
directly, whatever boxes and steps are asked for; errors and NaN notes where the source gives
them; a thread that ends on close; the wait for data in the step's timing."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.data.dataset_reader import H5Data
from hpctrain.data.dataset_writer import write_dataset
from hpctrain.data.prefetch import Prefetched
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import make_backend
from hpctrain.device.clock import CommClock
from hpctrain.errors import UserError
from hpctrain.model.net import parse_net
from hpctrain.plan.plans import LayerPlan
from hpctrain.record.timing import StepTimer, StepTimes
from hpctrain.run.loop import TrainConfig, train

BATCH = 4
FULL = ((0, BATCH), (0, 2), (0, 6), (0, 6))
# (step, box, samples): boxes that change, steps skipped and repeated, a return to step 0
SEQUENCE = [(0, FULL, (0, 4)), (1, FULL, (0, 4)), (2, ((0, 2), (0, 2), (0, 6), (0, 6)), (0, 2)),
            (3, ((2, 4), (1, 2), (3, 6), (0, 6)), (2, 4)), (4, ((2, 4), (1, 2), (3, 6), (0, 6)),
                                                          (2, 4)),
            (7, FULL, (1, 3)), (8, FULL, (1, 3)), (8, FULL, (0, 4)), (0, FULL, (0, 4)),
            (1, ((0, 4), (0, 1), (0, 6), (2, 5)), (0, 4))]


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(3)
    images = rng.standard_normal((13, 2, 6, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 13)
    path = tmp_path / "d.h5"
    write_dataset(path, images, labels, 3, images[:5], labels[:5], "random test data")
    return path


def sources(dataset):
    """Pairs of the same data: one to read directly, one to wrap."""
    backend = make_backend("cpu", "float64")
    yield H5Data(backend, dataset, BATCH, seed=1), H5Data(backend, dataset, BATCH, seed=1)
    yield (SyntheticData(backend, (2, 6, 6), 3, BATCH, seed=2),
           SyntheticData(backend, (2, 6, 6), 3, BATCH, seed=2))


@pytest.mark.parametrize("order", ["images first", "labels first"])
def test_blocks_equal_the_source_read_directly(dataset, order):
    for direct, wrapped in sources(dataset):
        with Prefetched(wrapped) as data:
            for step, box, samples in SEQUENCE:
                reads = [("images", box), ("labels", samples)]
                for part, key in reads if order == "images first" else reads[::-1]:
                    got = getattr(data, part)(step, key)
                    want = getattr(direct, part)(step, key)
                    assert got.dtype == want.dtype and np.array_equal(got, want), (part, step)
        assert data.hits > 0 and data.misses > 0  # the sequence holds both


def test_consecutive_steps_are_read_ahead(dataset):
    backend = make_backend("cpu", "float32")
    with H5Data(backend, dataset, BATCH) as source, Prefetched(source) as data:
        for step in range(6):
            data.images(step, FULL)
            data.labels(step, (0, BATCH))
        # step 0's images and labels are read on demand, every later one ahead
        assert (data.misses, data.hits) == (2, 10)


def test_held_out_batches_cycle(dataset):
    backend = make_backend("cpu", "float32")
    with H5Data(backend, dataset, BATCH, split="val") as source, \
            Prefetched(source, cycle=source.batches) as data:
        assert data.batches == 2  # the source's attributes pass through
        for _ in range(2):
            for batch in range(data.batches):
                assert np.array_equal(data.images(batch, FULL), source.images(batch, FULL))
                assert np.array_equal(data.labels(batch, (0, BATCH)),
                                      source.labels(batch, (0, BATCH)))
        assert data.misses == 2  # the second pass starts from the first batch read ahead


class Failing:
    """A source whose images of ``bad`` step raise ``error``; counts its threads."""

    nonfinite = None

    def __init__(self, error, bad):
        self.error, self.bad, self.threads = error, bad, set()

    def images(self, step, box):
        self.threads.add(threading.get_ident())
        if step == self.bad:
            raise self.error
        return np.full(3, float(step))

    def labels(self, step, samples):
        return np.arange(*samples) + step


@pytest.mark.parametrize("error", [RuntimeError("reading /train/images failed; damaged"),
                                   UserError("dataset 'd.h5': bad")])
def test_an_error_of_the_read_ahead_is_raised_by_the_call_that_asks_for_it(error):
    source = Failing(error, bad=2)
    with Prefetched(source) as data:
        data.images(0, FULL)
        data.images(1, FULL)  # the thread now reads step 2, and fails
        time.sleep(0.05)
        with pytest.raises(type(error)) as raised:
            data.images(2, FULL)
        assert raised.value is error  # the same object: type, message and cause unchanged
        assert data.images(3, FULL)[0] == 3.0  # and reading goes on
    assert source.threads and threading.get_ident() not in source.threads


def test_an_error_in_a_block_never_asked_for_is_not_raised():
    with Prefetched(Failing(RuntimeError("damaged"), bad=1)) as data:
        data.images(0, FULL)  # reads step 1 ahead, which fails
        assert data.images(5, FULL)[0] == 5.0


class NaNAt(Failing):
    """Notes a NaN, as H5Data does, when it reads step ``bad``."""

    def images(self, step, box):
        if step == self.bad and self.nonfinite is None:
            self.nonfinite = f"sample of step {step} holds NaN"
        return np.full(3, float(step))


def test_a_nan_is_noted_when_its_block_is_handed_out_not_when_read_ahead():
    with Prefetched(NaNAt(None, bad=3)) as data:
        data.images(2, FULL)  # reads step 3 ahead: the source notes the NaN
        data.labels(2, (0, 4))
        assert data.nonfinite is None  # step 2 holds none
        data.images(3, FULL)
        assert data.nonfinite == "sample of step 3 holds NaN"
    with Prefetched(NaNAt(None, bad=3)) as data:
        data.images(2, FULL)
        data.images(7, FULL)  # step 3 never handed out: its note is dropped
        assert data.nonfinite is None and data.source.nonfinite is None


def test_close_joins_the_thread_and_reads_go_on_without_it():
    data = Prefetched(Failing(None, bad=-1))
    thread = data._thread
    data.images(0, FULL)
    data.close()
    data.close()  # twice is fine
    assert not thread.is_alive()
    assert data.images(1, FULL)[0] == 1.0  # read directly now
    assert not any(t.name == "hpctrain-prefetch" and t.is_alive()
                   for t in threading.enumerate() if t is thread)


class Slow(Failing):
    """A source that takes ``seconds`` per images read."""

    def __init__(self, seconds):
        super().__init__(None, bad=-1)
        self.seconds = seconds

    def images(self, step, box):
        time.sleep(self.seconds)
        return np.full(3, float(step))


def test_the_wait_for_data_is_recorded_and_hidden_by_reading_ahead():
    backend = SimpleNamespace(clock=CommClock(), sync=lambda: None)

    def waits(data, compute):
        recorded = []
        for step in range(4):
            times = StepTimes.blank(["fc"])
            with StepTimer(backend, times) as timer:
                with timer.reading():
                    data.images(step, FULL)
                time.sleep(compute)  # the step's compute
                with timer.reading():
                    data.labels(step, (0, 4))
                timer.finish_step()
            recorded.append(times.data)
        return recorded

    assert min(waits(Slow(0.05), 0.0)) >= 0.05  # the whole read, every step
    with Prefetched(Slow(0.05)) as data:
        waited = waits(data, 0.1)
    assert waited[0] >= 0.05 and max(waited[1:]) < 0.02  # after the first, no wait


NET = parse_net("""
input channels=2 size=6 classes=3
conv out=3 kernel=3 pad=1
relu
flatten
linear out=3
""", "tiny")
PLAN = [LayerPlan("batch", (1, 1)), LayerPlan("follow"), LayerPlan("follow"),
        LayerPlan("batch", (1, 1))]


def test_training_on_a_dataset_with_and_without_prefetch_is_the_same(dataset):
    backend = make_backend("cpu", "float64")
    results = []
    for prefetch in (True, False):
        config = TrainConfig(BATCH, 5, 0.05, 0.9, 0.0, 0, 100, eval_every=2, prefetch=prefetch)
        with H5Data(backend, dataset, BATCH) as data, \
                H5Data(backend, dataset, BATCH, split="val") as val_data:
            results.append(train(NET, PLAN, config, backend, MPI.COMM_SELF, out=lambda *_: None,
                                 data=data, val_data=val_data))
    with_prefetch, without = results
    assert with_prefetch.losses == without.losses
    assert with_prefetch.validation == without.validation
    assert all(t.data > 0 for t in without.step_times)
    assert all(0 < t.data < t.step for t in with_prefetch.step_times)
    assert not any(t.name == "hpctrain-prefetch" for t in threading.enumerate())
