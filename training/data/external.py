"""Datasets of other people: torchvision's built-ins (``catalogue.TORCHVISION_DATASETS``) and
plug-ins (entry point group ``trainyard.datasets``), as map-style datasets of (image, label).

A built-in is read from the data folder where its files are (torchvision's own layout under
``--data-dir``); downloaded only where ``training.data.idx_files``'s rules allow (not with
``TRAINYARD_NO_DOWNLOAD``, and only when the download host answers); otherwise refused with the
path to put the files in. A plug-in's ``build(*, root, train)`` gets ``<data dir>/<name>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.catalogue import TORCHVISION_DATASETS, dataset_plugins
from training.data.downloads import downloads_disabled, reachable_mirror
from training.data.images import DataRefused, image_shape

# name -> (classes, channels, image size): known without opening a file
BUILTIN_META = {
    "cifar10": (10, 3, 32),
    "cifar100": (100, 3, 32),
    "kmnist": (10, 1, 28),
    "svhn": (10, 3, 32),
}


@dataclass(frozen=True)
class External:
    """Both splits of another dataset, with what the run says about them."""

    train: Any
    test: Any
    classes: int
    channels: int
    image_size: int
    source: str
    notes: tuple[str, ...]
    declared: tuple[tuple[float, ...], tuple[float, ...]] | None  # the dataset's mean, std


def builtin_open(name: str, data_dir: Path) -> External:
    # Here, not at the top: importing torchvision costs about 1 CPU-s (see training.data.idx_files).
    import torchvision.datasets as tv

    cls_name, sub = TORCHVISION_DATASETS[name]
    cls = getattr(tv, cls_name)
    where = data_dir / sub
    present = _present(name, data_dir)
    download = False
    source = f"torchvision {cls_name} from {where}"
    if not present:
        host = reachable_mirror(_urls(cls))
        if host is None:
            why = (
                "downloads are turned off (TRAINYARD_NO_DOWNLOAD)"
                if downloads_disabled()
                else "the download host cannot be reached"
            )
            raise DataRefused(
                f"--dataset {name}: torchvision's {cls_name} files are not under {data_dir} "
                f"(expected {where}) and {why}. Put the files there (torchvision.datasets."
                f"{cls_name}(root={str(data_dir)!r}, download=True) on a machine with network "
                "access writes them), or allow downloads."
            )
        download = True
        source = f"torchvision {cls_name}, downloaded from {host} into {data_dir}"
    train, test = (_build(cls, name, data_dir, split, download) for split in (True, False))
    classes, channels, size = BUILTIN_META[name]
    note = f"{name}: {len(train):,} train / {len(test):,} test images from {source}."
    return External(train, test, classes, channels, size, source, (note,), None)


def _present(name: str, data_dir: Path) -> bool:
    if name == "svhn":
        return all((data_dir / f"{s}_32x32.mat").is_file() for s in ("train", "test"))
    return (data_dir / TORCHVISION_DATASETS[name][1]).exists()


def _urls(cls: Any) -> list[str]:
    if hasattr(cls, "mirrors"):
        return list(cls.mirrors)
    if hasattr(cls, "url"):
        return [cls.url]
    return [cls.split_list["train"][0]]


def _build(cls: Any, name: str, data_dir: Path, train: bool, download: bool) -> Any:
    if name == "svhn":
        return cls(str(data_dir), split="train" if train else "test", download=download)
    return cls(str(data_dir), train=train, download=download)


def plugin_open(name: str, data_dir: Path) -> External:
    point = dataset_plugins()[name]
    build = point.load()
    root = data_dir / name
    train, test = build(root=root, train=True), build(root=root, train=False)
    if len(train) == 0 or len(test) == 0:
        raise DataRefused(f"--dataset {name}: the plug-in gave an empty split ({root})")
    channels, size = image_shape(train[0][0])
    classes, class_note = _plugin_classes(train)
    dist = getattr(point, "dist", None)
    source = f"plug-in {dist.name if dist is not None else point.value} ({point.value}), {root}"
    declared = _declared(train, channels)
    notes = [f"{name}: {len(train):,} train / {len(test):,} test images from {source}."]
    notes += [class_note] if class_note else []
    return External(train, test, classes, channels, size, source, tuple(notes), declared)


def _plugin_classes(train: Any) -> tuple[int, str]:
    classes = getattr(train, "classes", None)
    if isinstance(classes, int):
        return classes, ""
    if isinstance(classes, Sequence) and len(classes) > 0:
        return len(classes), ""
    # No `classes`: one pass over the labels (targets where the dataset keeps them).
    targets = getattr(train, "targets", None)
    labels = list(targets) if targets is not None else [train[i][1] for i in range(len(train))]
    count = int(max(int(v) for v in labels)) + 1
    return count, f"The plug-in's dataset has no `classes`: {count} classes from its labels."


def _declared(train: Any, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    mean, std = getattr(train, "mean", None), getattr(train, "std", None)
    if mean is None or std is None:
        return None
    m = tuple(float(v) for v in (mean if isinstance(mean, Sequence) else [mean]))
    s = tuple(float(v) for v in (std if isinstance(std, Sequence) else [std]))
    if len(m) != channels or len(s) != channels:
        return None
    return m, s


def external_open(name: str, data_dir: Path) -> External:
    if name in TORCHVISION_DATASETS:
        return builtin_open(name, data_dir)
    if name in dataset_plugins():
        return plugin_open(name, data_dir)
    raise DataRefused(f"--dataset {name}: no such dataset on this machine")
