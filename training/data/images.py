"""Images from files and from other people's datasets, decoded to one size and channel count.

An image folder is torchvision's ``ImageFolder`` layout: ``DIR/train`` and ``DIR/val`` (or
``DIR/test``) of class folders, or class folders directly (then split here with a fixed seed:
``HOLDOUT`` of each class is held out for testing). Class indices are the sorted folder names',
as ``ImageFolder`` numbers them.

Every image is decoded to ``channels x size x size`` uint8: grayscale stays one channel, colour
is three; the channel count is chosen from a sample of the files' modes (any colour image among
them makes it three, and the grayscale ones are converted). The size is the first training
image's shorter side (at most ``MAX_IMAGE_SIZE``); an image of another size is resized so that
its shorter side has that length, then centre-cropped, as torchvision's
``Resize(size) + CenterCrop(size)`` do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset as TorchDataset

from training.catalogue import IMAGE_EXTENSIONS, image_folder_facts

MAX_IMAGE_SIZE = 224
HOLDOUT = 0.2  # of each class, in a one-folder layout
HOLDOUT_SEED = 20240601
MODE_SAMPLE = 64  # files whose mode decides the channel count
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


class DataRefused(ValueError):
    """The data cannot be used as given; the message says why and what to do."""


@dataclass(frozen=True)
class Layout:
    """An image folder's files, split, with the decoding every image gets."""

    path: Path
    classes: tuple[str, ...]
    train: tuple[tuple[str, int], ...]  # (file, class index)
    test: tuple[tuple[str, int], ...]
    layout: str  # "train/val", "train/test" or "one folder"
    channels: int
    image_size: int
    notes: tuple[str, ...]


def folder_layout(data_path: str | None) -> Layout:
    """The image folder at ``data_path``, checked; DataRefused says what is wrong with it."""
    if not data_path:
        raise DataRefused("--dataset imagefolder needs --data-path DIR (an image folder)")
    path = Path(data_path).expanduser()
    if not path.exists():
        raise DataRefused(f"--data-path {data_path}: no such folder")
    facts = image_folder_facts(path) if path.is_dir() else None
    if facts is None:
        raise DataRefused(
            f"--data-path {data_path} is not an image folder: expected class folders of images "
            f"({', '.join(IMAGE_EXTENSIONS)}), directly or under train/ and val/ (or test/)"
        )
    if facts.layout == "one folder":
        classes, samples = _scan(path)
        train, test = _holdout(samples, len(classes))
        if not test and len(classes) >= 2:
            raise DataRefused(
                f"--data-path {data_path}: every class folder has a single image; with no val/ "
                "or test/ folder a class needs two images or more to hold one out for testing"
            )
        split_note = (
            f"{path} has no train/val folders: {HOLDOUT:.0%} of each class held out for testing "
            f"(seed {HOLDOUT_SEED}), {len(train):,} train / {len(test):,} test images."
        )
    else:
        evaluation = facts.layout.split("/")[1]
        classes, train_list = _scan(path / "train")
        eval_classes, test_list = _scan(path / evaluation)
        train, test = tuple(train_list), tuple(test_list)
        if eval_classes != classes:
            raise DataRefused(
                f"--data-path {data_path}: train/ and {evaluation}/ have different classes "
                f"(only in train/: {sorted(set(classes) - set(eval_classes))}; only in "
                f"{evaluation}/: {sorted(set(eval_classes) - set(classes))})"
            )
        split_note = f"{path}: its own {facts.layout} split."
    if len(classes) < 2:
        raise DataRefused(
            f"--data-path {data_path} has {len(classes)} class folder(s) with images: "
            "classifying needs at least two"
        )
    channels, channel_note = _channels(path, train)
    size, size_note = _size(path, train)
    notes = (split_note, channel_note, size_note)
    return Layout(
        path, classes, train, test, facts.layout, channels, size, tuple(n for n in notes if n)
    )


def _scan(split: Path) -> tuple[tuple[str, ...], list[tuple[str, int]]]:
    """Sorted class names with images, and (file relative to ``split``'s parent, index)."""
    folders = sorted(e.name for e in os.scandir(split) if e.is_dir() and not e.name.startswith("."))
    files = {name: _images_in(split / name) for name in folders}
    names = [name for name in folders if files[name]]
    samples = [
        (str(split / name / f), index) for index, name in enumerate(names) for f in files[name]
    ]
    return tuple(names), samples


def _images_in(folder: Path) -> list[str]:
    return sorted(
        e.name
        for e in os.scandir(folder)
        if e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file()
    )


def _holdout(
    samples: list[tuple[str, int]], classes: int
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    rng = np.random.default_rng(HOLDOUT_SEED)
    train: list[tuple[str, int]] = []
    test: list[tuple[str, int]] = []
    by_class: list[list[tuple[str, int]]] = [[] for _ in range(classes)]
    for sample in samples:
        by_class[sample[1]].append(sample)
    for mine in by_class:
        order = rng.permutation(len(mine))
        held = max(1, round(len(mine) * HOLDOUT)) if len(mine) > 1 else 0
        test += [mine[i] for i in sorted(order[:held])]
        train += [mine[i] for i in sorted(order[held:])]
    return tuple(train), tuple(test)


def _channels(path: Path, train: Sequence[tuple[str, int]]) -> tuple[int, str]:
    step = max(1, len(train) // MODE_SAMPLE)
    modes = []
    for file, _ in train[::step][:MODE_SAMPLE]:
        with Image.open(file) as img:  # reads the header only
            modes.append(img.mode)
    gray = sum(m in GRAY_MODES for m in modes)
    if gray == len(modes):
        return 1, "Images are grayscale: 1 channel."
    if gray == 0:
        return 3, "Images are colour: 3 channels (RGB)."
    return 3, (
        f"Mixed modes ({gray} of {len(modes)} sampled images grayscale): every image is "
        "converted to RGB, 3 channels."
    )


def _size(path: Path, train: Sequence[tuple[str, int]]) -> tuple[int, str]:
    with Image.open(train[0][0]) as img:
        w, h = img.size
    size = min(w, h, MAX_IMAGE_SIZE)
    note = (
        f"Images decoded to {size}x{size} (the first training image's shorter side"
        f"{f', capped at {MAX_IMAGE_SIZE}' if min(w, h) > MAX_IMAGE_SIZE else ''}); others are "
        "resized (shorter side) and centre-cropped to it."
    )
    return size, note


def image_decode(img: Any, channels: int, size: int) -> torch.Tensor:
    """A PIL image, or a uint8 / float (0..1) C x H x W tensor, as uint8 ``channels`` x
    ``size`` x ``size``."""
    if isinstance(img, torch.Tensor):
        t = img if img.dtype == torch.uint8 else (img.float() * 255).round().clamp(0, 255)
        t = t.to(torch.uint8)
        t = t.unsqueeze(0) if t.ndim == 2 else t
        if channels == 3 and t.shape[0] != 3:  # gray to RGB; RGBA drops its alpha
            t = t[:3] if t.shape[0] > 3 else t[:1].expand(3, -1, -1)
        elif channels == 1 and t.shape[0] != 1:  # PIL's "L": ITU-R 601-2 luma
            luma = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
            t = (t[:3].float() * luma).sum(0, keepdim=True).round().clamp(0, 255).to(torch.uint8)
        if tuple(t.shape[1:]) != (size, size):
            TF = _resizing()
            t = TF.center_crop(TF.resize(t, [size], antialias=True), [size, size])
        return t.contiguous()
    img = img.convert("L" if channels == 1 else "RGB")
    if img.size != (size, size):
        TF = _resizing()
        img = TF.center_crop(TF.resize(img, [size]), [size, size])
    array = np.asarray(img, dtype=np.uint8)
    t = torch.from_numpy(array.copy())
    return t.unsqueeze(0) if t.ndim == 2 else t.permute(2, 0, 1).contiguous()


def _resizing() -> ModuleType:
    """torchvision's image functions, imported where an image must be resized, not before:
    torchvision's import is about 1 CPU-s (see data.idx_files), paid again by every DataLoader
    worker that decodes, and images already at the size need none of it."""
    from torchvision.transforms import functional

    return functional


class FolderReader(TorchDataset[tuple[torch.Tensor, int]]):
    """One split of an image folder: ``[i]`` decodes the i-th file."""

    def __init__(self, samples: Sequence[tuple[str, int]], channels: int, size: int) -> None:
        self.samples = list(samples)
        self.channels = channels
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        file, label = self.samples[i]
        with Image.open(file) as img:
            return image_decode(img, self.channels, self.size), label


class DecodedView(TorchDataset[tuple[torch.Tensor, int]]):
    """Another map-style dataset of (image, label) -- torchvision's, a plug-in's -- with every
    image decoded as ours are."""

    def __init__(self, inner: Any, channels: int, size: int) -> None:
        self.inner = inner
        self.channels = channels
        self.size = size

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img, label = self.inner[i]
        return image_decode(img, self.channels, self.size), int(label)


def image_shape(img: Any) -> tuple[int, int]:
    """(channels, shorter side) of a PIL image or a C x H x W tensor, as decoding will take it."""
    if isinstance(img, torch.Tensor):
        c = 1 if img.ndim == 2 else int(img.shape[0])
        return (1 if c == 1 else 3), int(min(img.shape[-2:]))
    return (1 if img.mode in GRAY_MODES else 3), min(img.size)
