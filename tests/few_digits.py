"""Data sets with fewer test images, for runs whose figures do not depend on how many.

``sample_data`` for the modules whose figures do not depend on how many test digits a run
evaluates on (equalities between runs, events, checkpoints, shapes): the sample with 200 of its
1,000 test digits (``few_test_digits`` in tests/conftest.py). Every run evaluates each epoch on
the whole test split, about 0.9 s of CPU for the 1,000 with the built-in model, tens of seconds
for ViT-B and Inception v3; the suite runs hundreds. A module takes it by importing it:

    from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from training.data import idx_files

# Digits of the sample's test split that ``few_digits_write`` keeps (20 a class, give or take).
FEW_TEST_DIGITS = 200
# Fashion-MNIST's test images kept by ``fashion_few_tests_write``: the built-in model takes 0.9 ms
# of CPU an image here, 9 s a run for the 10,000 where a quick check trains one batch.
FEW_FASHION_TESTS = 1000


@pytest.fixture(scope="session", name="sample_data")
def sample_data_few(few_test_digits: Path) -> Path:
    return few_test_digits


def few_digits_write(path: Path) -> None:
    """Under ``path``, an MNIST of the sample's 4,000 training digits and the first 200 of its
    1,000 test digits, as torchvision's IDX files: real digits, read by the same path as a full
    MNIST's (``few_test_digits`` in tests/conftest.py, and the stack's ``data_dir``)."""
    raw = path / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for (split, kind), array in idx_files.split_mnist_sample().items():
        kept = array[:FEW_TEST_DIGITS] if split == "test" else array
        (raw / idx_files.IDX_FILES[(split, kind)]).write_bytes(idx_files.idx_bytes(kept))


def fashion_few_tests_write(raw: Path) -> None:
    """Fashion-MNIST in torchvision's layout under ``raw`` (``<data dir>/FashionMNIST/raw``,
    where the engine looks first): Debian's training split whole, its first 1,000 test images."""
    if all((raw / name).is_file() for name in idx_files.IDX_FILES.values()):
        return
    raw.mkdir(parents=True, exist_ok=True)
    for (split, kind), name in idx_files.IDX_FILES.items():
        data = gzip.decompress((idx_files.DEBIAN_FASHION_DIR / f"{name}.gz").read_bytes())
        if split == "test":
            shape, header = ((-1, 28, 28), 16) if kind == "images" else ((-1,), 8)
            kept = np.frombuffer(data, np.uint8, offset=header).reshape(shape)[:FEW_FASHION_TESTS]
            data = idx_files.idx_bytes(kept)
        (raw / name).write_bytes(data)
