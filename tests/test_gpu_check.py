"""``.ci/gpu-check``, the prepared device check, tried on the CPU so that it cannot rot between
the rare sessions that are lent a GPU machine (one batch per epoch; GPU-only strategies must be
refused with their reason, as the form and the CLI refuse them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from training import data as training_data

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu-check"

pytestmark = pytest.mark.usefixtures("no_processes_left")


def fashion_installed() -> bool:
    return all(
        (training_data.DEBIAN_FASHION_DIR / f"{name}.gz").is_file()
        for name in training_data.IDX_FILES.values()
    )


@pytest.mark.slow  # every strategy trained once (about 300 s on a loaded 2-core machine)
def test_the_device_check_runs_every_strategy_and_reads_the_machine(tmp_path: Path) -> None:
    """Slow (210 s on a loaded 2-core machine): one new interpreter per strategy, each importing
    torch and starting its own processes (ranks, workers), one batch per epoch of Fashion-MNIST,
    then the engine benchmark: the CPU trial of what a GPU machine runs."""
    need(fashion_installed(), "Debian's dataset-fashion-mnist package is not installed")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--dry-run", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    rows = {line.split()[0]: line for line in summary.splitlines()[3:14]}
    assert set(rows) == {"single", "dp", "ddp", "dp-primitives", "model-parallel", "hogwild",
                         "deepspeed", "tensor-parallel", "fsdp-tp", "fsdp", "pipeline"}  # fmt: skip
    for strategy in ("single", "dp", "ddp", "model-parallel", "hogwild", "tensor-parallel",
                     "fsdp-tp", "fsdp", "pipeline"):  # fmt: skip
        assert " yes " in rows[strategy] and "img/s" in rows[strategy], rows[strategy]
    assert "refused:" in rows["dp-primitives"] and "2 or more GPUs" in rows["dp-primitives"]
    # The step's options: fp16 refused without a GPU, the rest left to tests/test_step_options.
    variants = {line.split()[0]: line for line in summary.splitlines()[14:21]}
    assert "refused:" in variants["ddp/fp16"] and "GPUs only" in variants["ddp/fp16"]
    assert " yes " in variants["single/compile"] and "skipped: no GPU" in variants["single/compile"]
    assert proc.stdout.strip().splitlines()[-1] == "gpu-check: all as expected"
    assert "engine ratio:" in summary
    facts = json.loads((out / "facts.json").read_text())
    assert facts["cpu_count"] >= 1 and facts["torch"]["distributed_backends"]["gloo"]
    assert f"device page (NVML, as a worker reads it): {facts['gpu_status']}" in summary
    # Every run's own output is kept for the note.
    assert "===== -m training --strategy ddp" in (out / "gpu-check.log").read_text()


def test_prepare_copies_the_data_set_for_a_machine_without_it(tmp_path: Path) -> None:
    need(fashion_installed(), "Debian's dataset-fashion-mnist package is not installed")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "prepare", "--dir", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    copied = tmp_path / "fashion-mnist"
    assert sorted(p.name for p in copied.iterdir()) == sorted(
        f"{name}.gz" for name in training_data.IDX_FILES.values()
    )


def test_unknown_strategies_are_named() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--strategies", "single,tpu-magic"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "unknown strategies ['tpu-magic']" in proc.stderr
