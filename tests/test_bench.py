"""Smoke runs of the engine benchmarks (``python -m training.bench``), each as the README
documents it (its defaults) but with tiny step counts and two rounds (seeds) where it has them:
each must run to its end and print its ratio as the last line. Their values are measured by
running the commands (README), not here: timings on a shared CI machine mean nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.test_training import ROOT
from training.data import DEBIAN_FASHION_DIR

RATIO = re.compile(r"^(engine|memory|parity) ratio: \d+\.\d{3}$")


pytestmark = pytest.mark.usefixtures("no_processes_left")


def bench(sample_data: Path, *args: str) -> list[str]:
    env = dict(os.environ, TRAINYARD_NO_DOWNLOAD="1", TRAINYARD_DATA_DIR=str(sample_data))
    proc = subprocess.run(
        [sys.executable, "-m", "training.bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


@pytest.mark.slow  # a whole benchmark run
def test_engine_bench_prints_its_ratio(sample_data: Path) -> None:
    # The default data set: Fashion-MNIST where Debian's package is installed, as a user gets.
    lines = bench(sample_data, "engine", "--steps", "2", "--rounds", "2")
    assert RATIO.match(lines[-1]) and lines[-1].startswith("engine ratio: ")
    table = "\n".join(lines)
    for loop in ("ours", "dataloader", "compute"):
        assert re.search(rf"^{loop} +\d+\.\d", table, re.MULTILINE)
    assert "ours / dataloader loop:" in table


def test_engine_bench_image_folder_workload(sample_data: Path) -> None:
    """The second workload, small: 200 real MNIST-sample digits written as PNG files, the
    engine's resident and streaming paths beside a plain ImageFolder + DataLoader loop."""
    lines = bench(
        sample_data, "engine", "--workload", "imagefolder", "--dataset", "mnist",
        "--folder-per-class", "20", "--steps", "2", "--rounds", "2", "--folder-workers", "1",
    )  # fmt: skip
    assert re.match(r"^imagefolder ratio: \d+\.\d{3}$", lines[-1])
    table = "\n".join(lines)
    for loop in ("resident", "streaming", "imagefolder"):
        assert re.search(rf"^{loop} +\d+\.\d", table, re.MULTILINE)
    assert "streaming / resident:" in table and "engine ratio" not in table
    assert len(list(sample_data.glob("bench-imagefolder-mnist-20/train/class_*/*.png"))) == 200


@pytest.mark.slow  # a whole benchmark run
def test_memory_bench_prints_its_ratio(sample_data: Path) -> None:
    """Slow (about 300 s on the loaded 2-core development machine, 185 s for ddp alone): six
    trainings, single, ddp and hogwild each on Debian's full Fashion-MNIST and on the sample,
    every process's memory sampled meanwhile; engine 50 s, parity 71 s."""
    need(DEBIAN_FASHION_DIR.is_dir(), "Debian's dataset-fashion-mnist is not installed")
    # The default strategies (ddp and hogwild: each starts its processes its own way).
    lines = bench(sample_data, "memory", "--steps", "1")
    assert RATIO.match(lines[-1]) and lines[-1].startswith("memory ratio: ")
    assert any(line.startswith("ddp x2 / single: data footprint ratio") for line in lines)
    assert any(line.startswith("hogwild x2 / single: data footprint ratio") for line in lines)


@pytest.mark.slow  # a whole benchmark run
def test_parity_bench_prints_its_table_and_ratio(sample_data: Path) -> None:
    """Ten short runs: single, ddp and DDP's options as variants (ddp itself is added for
    them to be compared with), two seeds each."""
    variants = ("ddp+fp16", "ddp+powersgd", "ddp+shard-optimizer")
    lines = bench(
        sample_data, "parity", "--seeds", "1,2", "--steps-per-epoch", "3",
        "--strategies", ",".join(variants),
    )  # fmt: skip
    assert RATIO.match(lines[-1]) and lines[-1].startswith("parity ratio: ")
    table = "\n".join(lines)
    head = r"^strategy +batch/proc +procs +seed 1 +seed 2 +mean +spread +vs single$"
    assert re.search(head, table, re.M)
    acc = r"[01]\.\d{4}"
    # Two seeds: two accuracies, their mean and their spread (no longer 0 by construction).
    assert re.search(rf"^single +64 +1 +{acc} +{acc} +{acc} +{acc} +\+0\.0000$", table, re.M)
    assert re.search(rf"^ddp +32 +2 +{acc} +{acc} +{acc} +{acc} +[+-]{acc}$", table, re.M)
    for variant in variants:
        row = re.escape(variant)
        assert re.search(rf"^{row} +32 +2 +{acc} +{acc} +{acc} +{acc} +[+-]{acc}$", table, re.M)
        assert re.search(rf"^{row} vs ddp: [+-]{acc} mean accuracy$", table, re.M)


def test_bench_usage() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "training.bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "engine" in proc.stderr and "memory" in proc.stderr
    assert "parity" in proc.stderr
