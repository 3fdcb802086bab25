"""``byte-llama`` under DeepSpeed's ZeRO trains what one process trains at the same global batch:
ZeRO stage 2 (optimizer state and gradients partitioned, the stage whose gradients leave
``p.grad`` for ZeRO's partitions) over 2 ranks of 2 windows against single at 4, the smoke size,
3 steps of windows of 32 bytes from the Jargon File, on the CPU over Gloo.

At learning rate 0.1 and batches of 4 the gradient norm is above the clipping's 1.0 from the
first step on (1.07, 1.51, 2.57 here), so the test reaches DeepSpeed's own clipping
(``gradient_clipping``), not only its partitioned update: without it the third step's loss
moves by 2e-3 (the second's by 4e-5 only: Adam's update hardly changes when every gradient is
scaled alike). Tolerance as tests/test_lm_exactness.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import need
from tests.test_exactness import assert_same_parameters
from tests.test_tensor_parallel import _checkpoint, _epoch
from tests.test_training import Result, assert_well_formed, run_cli
from training import cli

STEPS = 3
COMMON = (
    *("--model", "byte-llama", "--model-size", "smoke", "--dataset", "jargon"),
    *("--seed", "7", "--steps-per-epoch", str(STEPS), "--log-interval", "1", "--lr", "0.1"),
)

pytestmark = pytest.mark.usefixtures("no_processes_left")


def lm_run(data: Path, out: Path, *args: str) -> Result:
    """A run that must succeed, its checkpoints in ``out``, named after it."""
    result = run_cli(data, *args, "--checkpoint-dir", str(out), "--run-id", out.name)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_well_formed(result, out.name)
    return result


def steps(result: Result, key: str) -> list[float]:
    return [e[key] for e in result.of_type("step")]


def assert_same_training(ours: Result, theirs: Result, count: int) -> None:
    """One epoch of ``count`` steps trained alike: each step's loss and gradient norm, the
    held-out loss and bits per byte, and the weights it ended with."""
    assert len(steps(ours, "train_loss")) == count
    assert steps(ours, "train_loss") == pytest.approx(steps(theirs, "train_loss"), abs=1e-5)
    assert steps(ours, "grad_norm") == pytest.approx(steps(theirs, "grad_norm"), rel=1e-4)
    mine, reference = _epoch(ours, 1), _epoch(theirs, 1)
    assert mine["test_loss"] == pytest.approx(reference["test_loss"], abs=1e-5)
    assert mine["bits_per_byte"] == pytest.approx(reference["bits_per_byte"], abs=2e-5)
    assert_same_parameters(_checkpoint(ours, 1), _checkpoint(theirs, 1), rtol=2e-4)


@pytest.mark.slow
def test_deepspeed_zero_2_equals_single(tmp_path: Path) -> None:
    need(cli.deepspeed_available(), "deepspeed is not installed (pip install -e '.[deepspeed]')")
    data = tmp_path / "data"
    single = lm_run(data, tmp_path / "single", *COMMON, "--strategy", "single", "--batch-size", "4")
    zero = lm_run(data, tmp_path / "zero", *COMMON, "--strategy", "deepspeed", "--zero-stage", "2",
                "--nproc", "2", "--batch-size", "2")  # fmt: skip
    assert zero.started["global_batch_size"] == 4
    assert any("DeepSpeed ZeRO stage 2 over 2 rank(s)" in n for n in zero.started["notes"])
    # The clipping was reached: each step's norm is above its maximum, 1.0.
    assert min(steps(single, "grad_norm")) > 1.0
    assert_same_training(zero, single, STEPS)
    assert _epoch(zero, 1)["sample"] == _epoch(single, 1)["sample"]
