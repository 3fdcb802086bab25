"""``.ci/gpu-check``, the prepared device check, tried on the CPU so that it cannot rot between
the rare sessions that are lent a GPU machine (one batch per epoch; GPU-only strategies must be
refused with their reason, as the form and the CLI refuse them)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import need
from training import data as training_data
from training.registry import OPTIONS_DECLARED

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu-check"

pytestmark = pytest.mark.usefixtures("no_processes_left")


def _script_load() -> ModuleType:
    """The script as a module (its name has no ``.py``), to test its plan without running it."""
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gpu_check = _script_load()


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
    assert "phases off wall by" in rows["ddp"]  # checked on every trained row (within 5%: ok)
    # The step's and DDP's options: those needing a GPU refused without one, the rest left to
    # tests/test_step_options.py and tests/test_ddp_options.py.
    variants = {
        line.split()[0]: line for line in summary.splitlines()[14 : 14 + len(gpu_check.VARIANTS)]
    }
    assert set(variants) == {label for label, _, _ in gpu_check.VARIANTS}
    assert "refused:" in variants["ddp/fp16"] and "GPUs only" in variants["ddp/fp16"]
    assert "refused:" in variants["ddp/hook-bf16"] and "Gloo" in variants["ddp/hook-bf16"]
    assert " yes " in variants["single/compile"] and "skipped: no GPU" in variants["single/compile"]
    assert " yes " in variants["ddp/powersgd"] and "skipped: no GPU" in variants["ddp/powersgd"]
    assert proc.stdout.strip().splitlines()[-1] == "gpu-check: all as expected"
    assert "engine ratio:" in summary
    facts = json.loads((out / "facts.json").read_text())
    assert facts["cpu_count"] >= 1 and facts["torch"]["distributed_backends"]["gloo"]
    assert f"device page (NVML, as a worker reads it): {facts['gpu_status']}" in summary
    # Every run's own output is kept for the note.
    assert "===== -m training --strategy ddp" in (out / "gpu-check.log").read_text()


def test_ddp_option_rows_beside_plain_ddp_refused_or_run_by_the_gpus() -> None:
    """DDP's communication hook and optimizer sharding rows, each with plain ddp's arguments plus
    its flags: on the CPU the bf16 hook is refused (Gloo), the others are skipped; on GPUs every
    one trains on NCCL, a rank per GPU."""
    rows = {label: (strategy, flags) for label, strategy, flags in gpu_check.VARIANTS}
    ddp = {
        "ddp/hook-fp16": ["--comm-hook", "fp16"],
        "ddp/powersgd": ["--comm-hook", "powersgd"],
        "ddp/hook-bf16": ["--comm-hook", "bf16"],
        "ddp/shard-optim": ["--shard-optimizer"],
    }
    for label, flags in ddp.items():
        strategy, extra = rows[label]
        assert strategy == "ddp" and list(extra) == flags
        on_cpu = gpu_check.variant_args(strategy, extra, 0)
        assert on_cpu == (["--nproc", "2", *flags], "refused" if "bf16" in flags else "skipped")
        on_gpus = gpu_check.variant_args(strategy, extra, 2)
        assert on_gpus == (["--gpus", "0,1", "--nproc", "2", *flags], "trains")
    # The step's fp16 is refused on the CPU as before, its other options skipped.
    assert gpu_check.variant_args("ddp", ("--precision", "fp16", "--accumulate", "2"), 0)[1] == (
        "refused"
    )
    assert gpu_check.variant_args("single", ("--compile",), 0)[1] == "skipped"


def test_gpu_only_flags_are_the_registrys() -> None:
    """The script imports nothing of ours: its list of values that need GPUs must be the
    registry's (``StrategyOption.gpu_only``), or a new one would be run and fail on the CPU."""
    declared = {
        (option.flag, str(value)) for option in OPTIONS_DECLARED for value, _ in option.gpu_only
    }
    assert set(gpu_check.GPU_ONLY) == declared


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
