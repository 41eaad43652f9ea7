"""The reference AlexNet in PyTorch: the same network as ``hpctrain/inputs/nets/alexnet.net``
(torchvision's one-tower AlexNet, the classifier sized for the input), which
``bench/ddp_reference.py`` trains alone or under DDP (gloo) for ``bench/throughput.py``."""

from __future__ import annotations


def alexnet(image_size: int):
    import torch
    from torch import nn

    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, 1, 1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, 1, 1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(3, 2), nn.Flatten())
    width = features(torch.zeros(1, 3, image_size, image_size)).shape[1]
    return nn.Sequential(features, nn.Dropout(), nn.Linear(width, 4096), nn.ReLU(), nn.Dropout(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1000))
