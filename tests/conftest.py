"""Fixtures shared by the serial and the MPI tests."""

import h5py
import numpy as np
import pytest


@pytest.fixture
def reads(monkeypatch):
    """Every read through h5py's Dataset.__getitem__: (dataset name, shape of what it read)."""
    log = []
    original = h5py.Dataset.__getitem__

    def recording(self, selection, *args, **kwargs):
        result = original(self, selection, *args, **kwargs)
        log.append((self.name, np.shape(result)))
        return result

    monkeypatch.setattr(h5py.Dataset, "__getitem__", recording)
    return log
