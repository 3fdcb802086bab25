"""Fashion-MNIST's first images, read from Debian's dataset-fashion-mnist IDX files: the data of
the framework scripts beside this file (each copies it into its own folder when a test packs it;
it is their own code, not Trainyard's)."""

import gzip
import os
from pathlib import Path

import numpy as np
import torch

FOLDER = Path(os.environ.get("TRAINYARD_FASHION_DIR", "/usr/share/datasets/fashion-mnist"))


def fashion(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `count` training images (float, 0..1, N x 1 x 28 x 28) and their labels."""
    with gzip.open(FOLDER / "train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16)[: count * 784]
    with gzip.open(FOLDER / "train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:count]
    x = torch.from_numpy(images.copy()).float().div(255).view(count, 1, 28, 28)
    return x, torch.from_numpy(labels.copy()).long()
