"""The engine benchmark's image-folder workload: real Fashion-MNIST (or MNIST sample) images
written out as PNG files once (``<data dir>/bench-imagefolder``, reused), trained on three ways
with the same model, batch size, threads and steps:

resident     the engine's data path with the images decoded once into uint8 tensors
             (``training.data.sources``, as a run within the resident budget takes it).
streaming    the engine's data path reading the files batch by batch through a DataLoader with
             ``--workers`` workers whose batch_sampler is the engine's batches (as a run over the
             budget takes it).
imagefolder  a plain torch loop: ``torchvision.datasets.ImageFolder`` + ``Grayscale``,
             ``ToTensor``, ``Normalize`` per image, ``DataLoader(shuffle=True)`` with the same
             workers.

Both DataLoader loops start their workers once per epoch, as a run does (the engine makes one
DataLoader per epoch; a plain loop iterates its loader once per epoch); their workers may decode
ahead while the other loops' rounds run, alike for the two.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms
from torchvision.datasets import ImageFolder

from training.data.batching import rank_batches
from training.data.datasets import Dataset
from training.data.idx_files import dataset_files, idx_read_into
from training.data.sources import dataset_open
from training.loop import StepFn, steps_run

LOOPS = ("resident", "streaming", "imagefolder")
FOLDER = "bench-imagefolder"
PER_CLASS = 300  # train images per class; a fifth as many for val
Loop = Callable[[StepFn, int], int]


def folder_ready(data_dir: Path, dataset: str, per_class: int = PER_CLASS) -> tuple[Path, str]:
    """The benchmark's image folder (written on first use), and what it holds."""
    root = data_dir / f"{FOLDER}-{dataset}-{per_class}"
    done = root / ".complete"
    if not done.is_file():
        images, labels = _real(dataset, data_dir)
        for label in range(10):
            rows = np.flatnonzero(labels == label)[: per_class + per_class // 5]
            for i, row in enumerate(rows):
                split = "train" if i < per_class else "val"
                folder = root / split / f"class_{label}"
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(images[row], mode="L").save(folder / f"{i:05d}.png")
        done.write_text("written by python -m training.bench engine\n")
    total = 10 * (per_class + per_class // 5)
    return root, f"{total:,} real {dataset} images as 28x28 PNG files in {root}"


def _real(dataset: str, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    files = dataset_files(dataset, data_dir)
    n, h, w = files.shape("train", "images")
    images = torch.empty((n, h, w), dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.int64)
    idx_read_into(files.path("train", "images"), images)
    idx_read_into(files.path("train", "labels"), labels)
    return images.numpy(), labels.numpy()


def loops_make(
    args: argparse.Namespace, root: Path, device: torch.device
) -> tuple[dict[str, Loop], Dataset]:
    data_dir = args.data_dir.expanduser().resolve()
    resident = dataset_open("imagefolder", data_dir, str(root), mode="resident")
    streaming = dataset_open(
        "imagefolder", data_dir, str(root), workers=args.folder_workers, mode="streaming"
    )
    loops = {
        "resident": _engine_loop(resident, args.batch_size, args.seed, device),
        "streaming": _engine_loop(streaming, args.batch_size, args.seed, device),
        "imagefolder": _plain_loop(root, args, resident, device),
    }
    return loops, resident


def _engine_loop(data: Dataset, batch_size: int, seed: int, device: torch.device) -> Loop:
    step_now: list[StepFn] = []

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return step_now[0](x, y)

    # As engine.epoch_run: steps_run over each epoch's batches, one after the other.
    timings = itertools.chain.from_iterable(
        steps_run(step, data, rank_batches(len(data.train), batch_size, 1, 0, seed, epoch), device)
        for epoch in itertools.count(1)
    )

    def run(step_fn: StepFn, steps: int) -> int:
        step_now[:] = [step_fn]
        images = 0
        last = None
        for timing in itertools.islice(timings, steps):
            images += timing.images
            last = timing.loss
        if last is not None:
            last.item()
        return images

    return run


def _plain_loop(root: Path, args: argparse.Namespace, data: Dataset, device: torch.device) -> Loop:
    transform = transforms.Compose(
        [
            transforms.Grayscale(1),
            transforms.ToTensor(),
            transforms.Normalize(list(data.mean), list(data.std)),
        ]
    )
    dataset = ImageFolder(str(root / "train"), transform=transform)
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.folder_workers,
        generator=generator,
    )

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield from loader

    stream = forever()

    def run(step: StepFn, steps: int) -> int:
        images = 0
        last = None
        for x, y in itertools.islice(stream, steps):
            last = step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
            images += len(y)
        if last is not None:
            last.item()
        return images

    return run
