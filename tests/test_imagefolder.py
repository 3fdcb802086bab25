"""Training on data other than the IDX sets: image folders (real MNIST digits written as PNG
files), torchvision's built-ins where their files are missing, and a dataset plug-in; resident
and streaming data paths, one shared copy under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.imagefolders import image_folder_write
from tests.plugin_package import plugin_package_write
from tests.test_training import Result, run_cli
from training.data.datasets import Split, dataset_meta
from training.data.sources import RESIDENT_ENV, dataset_open

TRAIN = ("--epochs", "2", "--batch-size", "32", "--log-interval", "1", "--seed", "3")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 classes of real digits: 40 train and 10 val PNG files each."""
    root = tmp_path_factory.mktemp("imagefolder") / "digits"
    return image_folder_write(root, per_class=40, test_per_class=10)


def _losses(result: Result) -> list[float]:
    return [e["train_loss"] for e in result.of_type("step")]


def _note(result: Result, start: str) -> str:
    return next(n for n in result.started["notes"] if n.startswith(start))


def _trained(result: Result) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.finished


def test_single_trains_on_an_image_folder_resident_and_streaming_gives_its_losses(
    sample_data: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("--dataset", "imagefolder", "--data-path", str(folder), *TRAIN, "--epochs", "1")
    resident = run_cli(sample_data, *args)
    finished = _trained(resident)
    assert finished["test_accuracy"] > 0.3  # chance is 0.1; one epoch of 400 gives 0.64-0.73
    started = resident.started
    assert started["data_mode"] == "resident" and started["data_path"] == str(folder)
    assert (started["train_size"], started["test_size"]) == (400, 100)
    assert "fit the budget" in _note(resident, "Data path: resident")
    # The same run streaming from the files, two DataLoader workers decoding: the same losses.
    monkeypatch.setenv(RESIDENT_ENV, "0")
    streaming = run_cli(sample_data, *args, "--workers", "2")
    _trained(streaming)
    assert streaming.started["data_mode"] == "streaming"
    assert "exceed the budget" in _note(streaming, "Data path: streaming")
    assert "2 DataLoader worker(s)" in _note(streaming, "Streaming with")
    assert streaming.started["shared_tensors"] == []
    assert _losses(streaming) == _losses(resident) and len(_losses(resident)) == 13
    assert streaming.finished["test_loss"] == resident.finished["test_loss"]


def test_ddp_resident_is_one_shared_copy(sample_data: Path, folder: Path) -> None:
    result = run_cli(
        sample_data, "--strategy", "ddp", "--nproc", "2", "--dataset", "imagefolder",
        "--data-path", str(folder), *TRAIN, "--batch-size", "16",
    )  # fmt: skip
    assert _trained(result)["test_accuracy"] > 0.3
    shared = result.started["shared_tensors"]
    assert [t["name"] for t in shared] == [
        "train.images", "train.labels", "test.images", "test.labels"
    ]  # fmt: skip
    assert all(t["is_shared"] for t in shared)
    assert shared[0]["shape"] == [400, 1, 28, 28]
    assert result.started["data_mode"] == "resident"


def test_hogwild_streams_without_workers(
    sample_data: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hogwild's processes are daemonic: DataLoader workers cannot start there."""
    monkeypatch.setenv(RESIDENT_ENV, "0")
    result = run_cli(
        sample_data, "--strategy", "hogwild", "--nproc", "2", "--dataset", "imagefolder",
        "--data-path", str(folder), "--dry-run",
    )  # fmt: skip
    _trained(result)
    assert result.started["data_mode"] == "streaming"
    assert "daemonic" in _note(result, "Hogwild's 2 processes read batches without")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "missing", "no such folder"),
        (lambda tmp: (tmp / "notes.txt").write_text("x") and tmp, "is not an image folder"),
        (
            lambda tmp: image_folder_write(tmp / "one", per_class=2, classes=1),
            "has 1 class folder(s)",
        ),
    ],
    ids=["missing", "not-an-image-folder", "one-class"],
)
def test_a_bad_data_path_is_refused(
    sample_data: Path, tmp_path: Path, make: Any, message: str
) -> None:
    result = run_cli(
        sample_data, "--dataset", "imagefolder", "--data-path", str(make(tmp_path)), timeout=60
    )
    assert result.returncode == 2 and result.events == []
    assert message in result.stderr and "--data-path" in result.stderr


def test_train_and_val_with_other_classes_are_refused(sample_data: Path, tmp_path: Path) -> None:
    path = image_folder_write(tmp_path / "f", per_class=2, test_per_class=1, classes=3)
    (path / "train" / "class_2").rename(path / "train" / "eel")
    (path / "val" / "class_2").rename(path / "val" / "fox")
    result = run_cli(sample_data, "--dataset", "imagefolder", "--data-path", str(path))
    assert result.returncode == 1
    error = result.events[-1]["error"]
    assert "different classes" in error and "'eel'" in error and "'fox'" in error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "imagefolder"], "required with --dataset imagefolder"),
        (["--dataset", "mnist", "--data-path", "/tmp"], "only with --dataset imagefolder"),
    ],
)
def test_data_path_where_it_does_not_belong(
    sample_data: Path, args: list[str], message: str
) -> None:
    result = run_cli(sample_data, *args, timeout=60)
    assert result.returncode == 2 and message in result.stderr


def test_cifar10_missing_names_the_path(sample_data: Path) -> None:
    result = run_cli(sample_data, "--dataset", "cifar10", "--dry-run")
    assert result.returncode == 1
    error = result.events[-1]["error"]
    assert str(sample_data / "cifar-10-batches-py") in error
    assert "TRAINYARD_NO_DOWNLOAD" in error


PLUGIN = '''
"""A dataset plug-in of real digits (the MNIST sample), as PIL images."""
from PIL import Image
from training.data.idx_files import split_mnist_sample


class Digits:
    classes = [str(d) for d in range(10)]

    def __init__(self, train):
        arrays = split_mnist_sample()
        split, count = ("train", 400) if train else ("test", 100)
        self.images = arrays[(split, "images")][:count]
        self.labels = arrays[(split, "labels")][:count]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return Image.fromarray(self.images[i], mode="L"), int(self.labels[i])


def build(*, root, train):
    return Digits(train)
'''


def test_a_dataset_plugin_trains(
    sample_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_package_write(
        tmp_path, module="ty_digits", source=PLUGIN, group="trainyard.datasets",
        entry_points={"digits": "ty_digits:build"},
    )  # fmt: skip
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(root)]))
    result = run_cli(sample_data, "--dataset", "digits", *TRAIN, "--epochs", "1")
    assert _trained(result)["test_accuracy"] > 0.3
    assert result.started["dataset"] == "digits"
    assert "plug-in ty-digits" in result.started["dataset_source"]
    assert result.started["data_mode"] == "resident"


def test_meta_is_known_before_loading(tmp_path: Path) -> None:
    gray = image_folder_write(tmp_path / "gray", per_class=3, test_per_class=1, classes=4)
    rgb = image_folder_write(
        tmp_path / "rgb", per_class=4, test_per_class=1, classes=3, rgb=True, layout="one folder"
    )
    meta = dataset_meta("imagefolder", tmp_path, str(gray))
    assert (meta.classes, meta.channels, meta.image_size) == (4, 1, 28)
    assert dataset_meta("imagefolder", tmp_path, str(rgb)).channels == 3
    assert dataset_meta("cifar100", tmp_path, None).classes == 100
    data = dataset_open("imagefolder", tmp_path, str(rgb))
    # One folder: a fifth of each class held out with the fixed seed.
    assert (len(data.train), len(data.test), data.channels) == (12, 3, 3)
    assert len(data.mean) == 3 and data.mean[0] != data.mean[2]  # tinted: channels differ
    # The per-channel mean really is the training pixels' mean.
    assert isinstance(data.train, Split) and data.mode == "resident"
    images = data.train.images
    expected = images.to(torch.float64).mean(dim=(0, 2, 3)) / 255
    assert torch.allclose(torch.tensor(data.mean, dtype=torch.float64), expected, atol=1e-5)


def test_tensor_images_decode_as_files_do() -> None:
    """A plug-in may give uint8 or float tensors instead of PIL images: same pixels out."""
    from PIL import Image

    from training.data.idx_files import split_mnist_sample
    from training.data.images import image_decode

    digit = torch.from_numpy(split_mnist_sample()[("train", "images")][0])  # 28 x 28, uint8
    as_file = image_decode(Image.fromarray(digit.numpy(), mode="L"), 3, 28)
    assert as_file.shape == (3, 28, 28) and torch.equal(as_file[0], digit)
    assert torch.equal(image_decode(digit.unsqueeze(0), 3, 28), as_file)
    assert torch.equal(image_decode(digit.float().div(255).unsqueeze(0), 1, 28)[0], digit)
    tinted = torch.stack([digit, digit // 2, 255 - digit])
    pil_gray = image_decode(Image.fromarray(tinted.permute(1, 2, 0).numpy(), mode="RGB"), 1, 28)
    tensor_gray = image_decode(tinted, 1, 28)
    assert (pil_gray.int() - tensor_gray.int()).abs().max() <= 1  # PIL's luma, rounded
    assert image_decode(digit.unsqueeze(0), 1, 14).shape == (1, 14, 14)


DECODES = """
import sys
import torch
from PIL import Image
from training.data.images import image_decode

image_decode(Image.new("L", (28, 28)), 1, 28)
image_decode(torch.zeros(3, 28, 28, dtype=torch.uint8), 1, 28)
before = "torchvision" in sys.modules
assert image_decode(Image.new("L", (32, 32)), 1, 28).shape == (1, 28, 28)
print(before, "torchvision" in sys.modules)
"""


def test_images_at_the_size_decode_without_torchvision() -> None:
    """torchvision's import is about 1 CPU-s in each DataLoader worker that decodes (they were
    two in every run on an image folder); only a resize needs it."""
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", DECODES], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parent.parent, check=True,
    )  # fmt: skip
    assert result.stdout.split() == ["False", "True"]


def test_one_image_a_class_in_one_folder_is_refused(tmp_path: Path) -> None:
    """Nothing could be held out for testing: refused before training (not a division by zero
    after the first epoch)."""
    from training.data.images import DataRefused

    path = image_folder_write(tmp_path / "f", per_class=1, classes=2, layout="one folder")
    with pytest.raises(DataRefused, match="every class folder has a single image"):
        dataset_meta("imagefolder", tmp_path, str(path))


def test_a_short_last_batch_leaves_no_rank_a_single_image() -> None:
    """BatchNorm cannot train on one image; a folder of 64 x N + 1 images ended every epoch
    with such a batch (resnet18: "Expected more than 1 value per channel")."""
    from training.data.batching import global_batches, rank_batches, steps_per_epoch

    assert [len(b) for b in global_batches(129, 64, 1, 1)] == [64, 64]
    assert steps_per_epoch(129, 64, 1, None) == 2
    assert [len(b) for b in global_batches(130, 64, 1, 1)] == [64, 64, 2]
    # Two ranks: a last global batch of 3 would give one rank a single image.
    assert [len(b) for b in rank_batches(131, 64, 2, 1, 1, 1)] == [64]
    assert steps_per_epoch(131, 64, 2, None) == 1
    assert [len(b) for b in rank_batches(132, 64, 2, 1, 1, 1)] == [64, 2]
    assert steps_per_epoch(132, 64, 2, None) == 2
    # --batch-size 1 keeps its batches of one (the user's choice).
    assert len(global_batches(3, 1, 1, 1)) == 3
