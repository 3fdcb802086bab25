"""Datasets as in-memory tensors: a split, a dataset and what its model is built from, and
batches taken from them.

Each split is loaded once as uint8 images (N x C x H x W) and int64 labels; batches are taken by
indexing and normalised per channel on the fly, on the training device, with the mean and std
computed from the training split. That keeps per-sample PIL transforms and DataLoader worker
processes out of the picture where the decoded data fits in memory (``data.sources`` decides;
larger data streams through a DataLoader, ``training.data.streaming``). MNIST's and
Fashion-MNIST's IDX files (``training.data.idx_files``: where they come from) are read straight
into the tensors' memory, which may be a shared-memory mapping (``training.data.shared_data``):
loading never holds a second copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset as TorchDataset

from training.catalogue import IMAGEFOLDER
from training.data.external import BUILTIN_META, external_open
from training.data.idx_files import (
    IDX_CLASSES,
    IDX_IMAGE_SIZE,
    IDX_NAMES,
    dataset_files,
    idx_shapes,
    idx_tensors_fill,
)
from training.data.images import folder_layout
from training.data.text import TextData, TextSplit, text_read, text_splits
from training.text_catalogue import BYTE_VOCAB, TEXT_DATASETS


@dataclass(frozen=True)
class Split:
    """A split resident in memory (this process's, or a shared-memory mapping)."""

    images: torch.Tensor  # uint8, N x C x H x W
    labels: torch.Tensor  # int64, N

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class StreamSplit:
    """A split read from its files batch by batch (``training.data.streaming``): ``reader[i]`` is
    (uint8 C x H x W image, int label), decoded to the dataset's size and channels."""

    reader: TorchDataset[tuple[torch.Tensor, int]]
    size: int
    workers: int  # DataLoader worker processes (0: decoded in the training process)

    def __len__(self) -> int:
        return self.size


AnySplit = Split | StreamSplit | TextSplit


def resident(split: AnySplit) -> Split:
    """``split`` as the resident tensors it must be here (TypeError where it streams)."""
    if not isinstance(split, Split):
        raise TypeError("this split streams from its files; it has no tensors in memory")
    return split


@dataclass(frozen=True)
class DatasetMeta:
    """What the model is built from, known before the data loads (``dataset_meta``)."""

    name: str
    classes: int
    channels: int
    image_size: int


@dataclass(frozen=True)
class Dataset:
    name: str
    train: AnySplit
    test: AnySplit
    source: str  # a plain sentence for the user
    mean: tuple[float, ...]  # per channel, of the training split's pixels in 0..1
    std: tuple[float, ...]
    substitute: bool  # True for the MNIST sample, which stands in for the full MNIST
    classes: int = IDX_CLASSES
    channels: int = 1
    image_size: int = IDX_IMAGE_SIZE
    mode: str = "resident"  # started.data_mode: "resident" or "streaming"
    notes: tuple[str, ...] = ()  # for started.notes: which data path, and why


def dataset_meta(name: str, data_dir: Path, data_path: str | None) -> DatasetMeta:
    """Classes, channels and image size of the dataset, cheaply (headers and a few files, no
    decoding of the whole set): the model is built from them before the data loads."""
    if name in IDX_NAMES:
        return DatasetMeta(name, IDX_CLASSES, 1, IDX_IMAGE_SIZE)
    if name in TEXT_DATASETS:  # bytes: 256 "classes", the next byte's value
        return DatasetMeta(name, BYTE_VOCAB, 0, 0)
    if name == IMAGEFOLDER:
        layout = folder_layout(data_path)
        return DatasetMeta(name, len(layout.classes), layout.channels, layout.image_size)
    if name in BUILTIN_META:
        return DatasetMeta(name, *BUILTIN_META[name])
    ext = external_open(name, data_dir)
    return DatasetMeta(name, ext.classes, ext.channels, ext.image_size)


def load_dataset(name: str, data_dir: Path) -> Dataset:
    """MNIST or Fashion-MNIST in this process's own memory (``training.data.sources.dataset_open``
    opens every dataset, ``training.data.shared_data`` shares one copy between processes)."""
    files = dataset_files(name, data_dir)
    tensors = {
        key: torch.empty(shape, dtype=torch.uint8 if key.endswith("images") else torch.int64)
        for key, shape in idx_shapes(files).items()
    }
    idx_tensors_fill(files, tensors)
    mean, std = channel_stats(tensors["train.images"])
    train = Split(tensors["train.images"], tensors["train.labels"])
    test = Split(tensors["test.images"], tensors["test.labels"])
    return Dataset(name, train, test, files.source, mean, std, files.substitute)


def text_dataset(
    name: str,
    data_dir: Path,
    data_path: str | None,
    seq_len: int,
    text: TextData | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Dataset:
    """A text dataset (``training.data.text``), its windows ``seq_len`` bytes long: read here
    unless ``text`` was, its bytes on ``tensors`` where given (a shared copy), else this
    process's own."""
    text = text or text_read(name, data_dir, data_path)
    train, test = text_splits(text, seq_len, tensors)
    return Dataset(
        name, train, test, text.source, mean=(), std=(), substitute=False, classes=BYTE_VOCAB,
        channels=0, image_size=0, notes=text.notes,
    )  # fmt: skip


def to_batch(
    split: Split,
    idx: torch.Tensor,
    device: torch.device,
    mean: Sequence[float],
    std: Sequence[float],
    label_device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (float, B x C x H x W, normalised) on ``device`` and labels for ``idx`` on
    ``label_device`` (default ``device``; differs where the model's last stage sits elsewhere)."""
    x = split.images.index_select(0, idx)
    y = split.labels.index_select(0, idx)
    return batch_to(x, y, device, mean, std, label_device)


def batch_to(
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
    mean: Sequence[float],
    std: Sequence[float],
    label_device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of uint8 images (B x C x H x W) and labels, from either data path, as the model
    takes it: float, normalised per channel, on ``device``; labels on ``label_device``."""
    label_device = device if label_device is None else label_device
    if not x.is_floating_point() and x.dtype != torch.uint8:  # a language model's tokens
        return x.to(device, non_blocking=True), y.to(label_device, non_blocking=True)
    if device.type == "cuda":
        # Copy uint8 (4x less than float) from pinned memory, normalise on the GPU. pin_memory()
        # takes its buffer from the caching host allocator, which does not hand it out again
        # until the asynchronous copy has finished.
        x = x.pin_memory().to(device, non_blocking=True)
    if label_device.type == "cuda":
        y = y.pin_memory().to(label_device, non_blocking=True)
    elif y.device != label_device:
        y = y.to(label_device)
    x = x.to(torch.float32).div_(255.0)
    if len(mean) == 1:
        return x.sub_(mean[0]).div_(std[0]), y
    shape = (1, len(mean), 1, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(shape).to(x.device, non_blocking=True)
    s = torch.tensor(std, dtype=torch.float32).view(shape).to(x.device, non_blocking=True)
    return x.sub_(m).div_(s), y


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images (N x C x H x W) as pixels in 0..1, summed in
    float64 over chunks (no float copy of the whole split)."""
    channels = images.shape[1]
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros(channels, dtype=torch.float64)
    for chunk in images.split(2048):
        c = chunk.to(torch.float64)
        total += c.sum(dim=(0, 2, 3))
        squares += c.square().sum(dim=(0, 2, 3))
    count = max(1, images.numel() // max(1, channels))
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(1e-12).sqrt()
    # A constant image set has no spread; 1.0 leaves it unscaled rather than dividing by ~0.
    std = torch.where(std < 1e-6, torch.full_like(std, 255.0), std)
    return tuple(round(float(v) / 255, 6) for v in mean), tuple(
        round(float(v) / 255, 6) for v in std
    )
