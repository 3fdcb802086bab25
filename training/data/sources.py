"""Which data path a run takes: resident (decoded once into uint8 tensors, in shared memory where
processes share a machine) or streaming (decoded batch by batch by a DataLoader), and why.

A dataset is first planned (``data_plan``): where its files are, its classes, channels, image
size and number of images, and how to fill resident tensors or read it batch by batch; nothing
is decoded yet. Its decoded size then decides: within ``resident_budget()`` it stays resident,
else it streams. The budget is ``$TRAINYARD_RESIDENT_MAX_BYTES`` where set, else the smaller of
a quarter of the available memory and half of /dev/shm's free space (a resident copy under
torchrun or Hogwild lives there). MNIST and Fashion-MNIST are always resident: their IDX files
are read straight into the tensors (55 MB for the full Fashion-MNIST).

Per-channel mean and std come from the training split: all of it when resident, a seeded
sample of ``STATS_SAMPLE`` images (in index order, so a split no larger than the sample gives
the resident figures exactly) when streaming; a dataset may declare its own instead.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from training.catalogue import IMAGEFOLDER
from training.data.datasets import Dataset, Split, StreamSplit, channel_stats
from training.data.external import external_open
from training.data.idx_files import IDX_NAMES, dataset_files, idx_shapes, idx_tensors_fill
from training.data.images import DataRefused, DecodedView, FolderReader, folder_layout

RESIDENT_ENV = "TRAINYARD_RESIDENT_MAX_BYTES"
STATS_SAMPLE = 1000
STATS_SEED = 20240601
FILL_BATCH = 256
Reader = TorchDataset[tuple[torch.Tensor, int]]
Tensors = dict[str, torch.Tensor]
MODES = ("resident", "streaming")


@dataclass(frozen=True)
class DataInfo:
    """A dataset's facts besides its tensors: picklable, so a shared segment carries them."""

    name: str
    source: str
    substitute: bool
    classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    mode: str = "resident"
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DataPlan:
    """A dataset before it loads: its facts, and the two ways of loading it."""

    info: DataInfo
    sizes: tuple[int, int]  # train, test images
    fill: Callable[[Tensors, int], None]  # (the resident tensors, DataLoader workers)
    readers: tuple[Reader, Reader] | None  # for streaming; None: resident only (IDX files)
    declared: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @property
    def shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        c, s = self.info.channels, self.info.image_size
        train, test = self.sizes
        return {
            "train.images": ((train, c, s, s), torch.uint8),
            "test.images": ((test, c, s, s), torch.uint8),
            "train.labels": ((train,), torch.int64),
            "test.labels": ((test,), torch.int64),
        }

    @property
    def nbytes(self) -> int:
        total = 0
        for shape, dtype in self.shapes.values():
            total += int(torch.Size(shape).numel()) * dtype.itemsize
        return total


def data_plan(name: str, data_dir: Path, data_path: str | None) -> DataPlan:
    """Find the dataset (refusing with DataRefused where it cannot be used) and plan its load."""
    if name in IDX_NAMES:
        files = dataset_files(name, data_dir)
        shapes = idx_shapes(files)
        sizes = (shapes["train.labels"][0], shapes["test.labels"][0])
        info = DataInfo(name, files.source, files.substitute, 10, 1, 28)
        return DataPlan(info, sizes, lambda t, _w: idx_tensors_fill(files, t), None)
    if name == IMAGEFOLDER:
        layout = folder_layout(data_path)
        c, s = layout.channels, layout.image_size
        readers: tuple[Reader, Reader] = (
            FolderReader(layout.train, c, s),
            FolderReader(layout.test, c, s),
        )
        source = (
            f"image folder {layout.path} ({layout.layout}; {len(layout.classes)} classes, "
            f"{len(layout.train):,} train / {len(layout.test):,} test images)"
        )
        info = DataInfo(name, source, False, len(layout.classes), c, s, notes=layout.notes)
    else:
        ext = external_open(name, data_dir)
        c, s = ext.channels, ext.image_size
        readers = (DecodedView(ext.train, c, s), DecodedView(ext.test, c, s))
        info = DataInfo(name, ext.source, False, ext.classes, c, s, notes=ext.notes)
        return DataPlan(info, _sizes(readers), _readers_fill(readers), readers, ext.declared)
    return DataPlan(info, _sizes(readers), _readers_fill(readers), readers)


def _sizes(readers: tuple[Reader, Reader]) -> tuple[int, int]:
    return len(readers[0]), len(readers[1])  # type: ignore[arg-type]


def _readers_fill(readers: tuple[Reader, Reader]) -> Callable[[Tensors, int], None]:
    def fill(tensors: Tensors, workers: int) -> None:
        for split, reader in zip(("train", "test"), readers, strict=True):
            reader_fill(reader, tensors[f"{split}.images"], tensors[f"{split}.labels"], workers)

    return fill


def reader_fill(reader: Reader, images: torch.Tensor, labels: torch.Tensor, workers: int) -> None:
    """Decode every item of ``reader`` into ``images`` and ``labels``, in order (a DataLoader
    with ``workers`` processes decodes ahead)."""
    loader = DataLoader(reader, batch_size=FILL_BATCH, shuffle=False, num_workers=workers)
    at = 0
    for x, y in loader:
        images[at : at + len(y)].copy_(x)
        labels[at : at + len(y)].copy_(y)
        at += len(y)
    if at != len(labels):
        raise RuntimeError(f"the dataset gave {at} images, it said it has {len(labels)}")


def resident_budget() -> tuple[int, str]:
    """(bytes, why): the most decoded data kept resident."""
    given = os.environ.get(RESIDENT_ENV, "").strip()
    if given:
        try:
            return max(0, int(given)), f"${RESIDENT_ENV}"
        except ValueError:
            raise DataRefused(f"${RESIDENT_ENV}={given!r} is not a number of bytes") from None
    available = _mem_available()
    try:
        shm = shutil.disk_usage("/dev/shm").free
    except OSError:
        shm = available * 2
    budget = min(available // 4, shm // 2)
    why = (
        f"the smaller of a quarter of the available memory ({mib(available)}) and half of "
        f"/dev/shm's free space ({mib(shm)}); set ${RESIDENT_ENV} to change it"
    )
    return budget, why


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def mode_choose(plan: DataPlan) -> tuple[str, str]:
    """("resident" or "streaming", the note that says why, with the figures)."""
    if plan.readers is None:
        return "resident", (
            f"Data path: resident (IDX files read straight into memory, {mib(plan.nbytes)})."
        )
    budget, why = resident_budget()
    if plan.nbytes <= budget:
        return "resident", (
            f"Data path: resident: the decoded images ({mib(plan.nbytes)}) fit the budget of "
            f"{mib(budget)} ({why})."
        )
    return "streaming", (
        f"Data path: streaming: the decoded images ({mib(plan.nbytes)}) exceed the budget of "
        f"{mib(budget)} ({why}); a DataLoader decodes each batch."
    )


def workers_usable(requested: int) -> tuple[int, str]:
    """DataLoader workers this process can start: none in a daemonic process (Hogwild's,
    a Celery prefork child), which may not have children."""
    if requested > 0 and multiprocessing.current_process().daemon:
        return 0, (
            f"DataLoader workers: 0 instead of {requested}: this is a daemonic process "
            "(Hogwild's), which cannot start worker processes; images decode in it."
        )
    return requested, ""


def resident_dataset(info: DataInfo, tensors: Tensors) -> Dataset:
    train = Split(tensors["train.images"], tensors["train.labels"])
    test = Split(tensors["test.images"], tensors["test.labels"])
    return _dataset(info, train, test)


def _dataset(info: DataInfo, train: Split | StreamSplit, test: Split | StreamSplit) -> Dataset:
    return Dataset(
        info.name, train, test, info.source, info.mean, info.std, info.substitute,
        classes=info.classes, channels=info.channels, image_size=info.image_size,
        mode=info.mode, notes=info.notes,
    )  # fmt: skip


def resident_info(plan: DataPlan, tensors: Tensors, note: str) -> DataInfo:
    """The plan's facts once its tensors are filled: mean/std computed from them (or declared)."""
    mean, std = plan.declared or channel_stats(tensors["train.images"])
    notes = (*plan.info.notes, note, _stats_note(mean, std, plan.declared is not None, None))
    return replace(plan.info, mean=mean, std=std, mode="resident", notes=notes)


def _stats_note(
    mean: tuple[float, ...], std: tuple[float, ...], declared: bool, sample: int | None
) -> str:
    where = (
        "declared by the dataset"
        if declared
        else "of the whole training split"
        if sample is None
        else f"of a seeded sample of {sample:,} training images"
    )
    return f"Normalisation per channel, {where}: mean {list(mean)}, std {list(std)}."


def tensors_empty(plan: DataPlan) -> Tensors:
    return {name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in plan.shapes.items()}


def streaming_dataset(plan: DataPlan, note: str, workers: int) -> Dataset:
    """The plan's data read batch by batch, with stats from a sample of the training split."""
    assert plan.readers is not None
    usable, workers_note = workers_usable(workers)
    train_reader, test_reader = plan.readers
    sample = None
    if plan.declared:
        mean, std = plan.declared
    else:
        sample = min(STATS_SAMPLE, plan.sizes[0])
        mean, std = channel_stats(_sample_images(plan, train_reader, sample, usable))
    notes = [*plan.info.notes, note, f"Streaming with {usable} DataLoader worker(s) (--workers)."]
    notes += [workers_note] if workers_note else []
    notes.append(_stats_note(mean, std, plan.declared is not None, sample))
    info = replace(plan.info, mean=mean, std=std, mode="streaming", notes=tuple(notes))
    train = StreamSplit(train_reader, plan.sizes[0], usable)
    test = StreamSplit(test_reader, plan.sizes[1], usable)
    return _dataset(info, train, test)


def _sample_images(plan: DataPlan, reader: Reader, count: int, workers: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(STATS_SEED)
    chosen = torch.randperm(plan.sizes[0], generator=generator)[:count].sort().values
    subset = torch.utils.data.Subset(reader, chosen.tolist())
    c, s = plan.info.channels, plan.info.image_size
    images = torch.empty((count, c, s, s), dtype=torch.uint8)
    reader_fill(subset, images, torch.empty(count, dtype=torch.int64), workers)
    return images


def dataset_open(
    name: str,
    data_dir: Path,
    data_path: str | None = None,
    *,
    workers: int = 0,
    mode: str | None = None,
) -> Dataset:
    """The dataset in this process: resident in its own memory, or streaming; ``mode`` forces
    one (Hogwild's processes follow their parent's choice), else the budget decides."""
    plan = data_plan(name, data_dir, data_path)
    chosen, note = mode_choose(plan)
    # IDX files (no readers) are always resident.
    if mode is not None and mode != chosen and plan.readers is not None:
        chosen, note = mode, f"Data path: {mode} (as the run's first process chose)."
    if chosen == "streaming":
        return streaming_dataset(plan, note, workers)
    tensors = tensors_empty(plan)
    plan.fill(tensors, workers_usable(workers)[0])
    return resident_dataset(resident_info(plan, tensors, note), tensors)
