"""The sources a training run reads: a dataset's training and held-out splits, or synthetic data,
under the net's windows and the run's augmentation (:mod:`hpctrain.data.augment`).

A net smaller than the images reads windows of them: random ones under an augmentation, else,
and always for the held-out split, the centre.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.comm.agree import agreed
from hpctrain.data.augment import augment, window_size
from hpctrain.data.dataset_fit import feeds_flat
from hpctrain.data.dataset_format import DatasetInfo
from hpctrain.data.dataset_reader import H5Data
from hpctrain.data.source import DataSource, HeldOutSource
from hpctrain.data.synthetic import SyntheticData
from hpctrain.device.backend import Backend
from hpctrain.model.net import NetSpec


@dataclass
class RunSources:
    """What :func:`~hpctrain.run.loop.train` reads, and the dataset splits to close after it."""

    train: DataSource | None  # None: the run's own synthetic data, as it is
    val: HeldOutSource | None  # None: no held-out split
    readers: tuple[H5Data, ...] = ()  # the dataset's splits, opened here

    def close(self) -> None:
        """Close the dataset's splits."""
        for reader in self.readers:
            reader.close()


def open_sources(comm: Any, backend: Backend, net: NetSpec, batch: int, seed: int, mode: str,
                 path: str | None = None, dataset: DatasetInfo | None = None) -> RunSources:
    """The sources a run of ``net`` reads, on every rank of ``comm`` (collective).

    Parameters
    ----------
    comm : the run's communicator; every rank opens the dataset, and a failure on any stops all.
    backend : where the batches go.
    net : the net, whose input sets the windows and, for a flat input, the flattening.
    batch, seed : the global batch and the run's seed (the shuffle, the augmentation draws).
    mode : the augmentation of the training split: none, flip, crop or standard.
    path, dataset : the dataset file and its description, or None for synthetic data.
    """
    data = val_data = None
    readers: tuple[H5Data, ...] = ()
    if dataset is not None:
        flatten = feeds_flat(dataset.sample_shape, net.input_shape)

        def open_data(split: str) -> H5Data:
            return agreed(comm, lambda: H5Data(backend, path, batch, seed, split, dataset,
                                               flatten),
                          everywhere=True)

        data = open_data("train")
        val_data = open_data("val") if dataset.val_size else None
        readers = tuple(r for r in (data, val_data) if r is not None)
    train_data = data
    if mode != "none" or data is not None:
        size = window_size(net.input_shape)
        train_data = augment(data or SyntheticData.for_net(backend, net, batch, seed), mode, seed,
                             size=size)
        if val_data is not None:
            val_data = augment(val_data, "none", seed, size=size)
    return RunSources(train_data, val_data, readers)
