"""Stop at target (``--target-accuracy``): after the first epoch whose test accuracy reaches it,
training ends normally, with a note saying so; every rank (or Hogwild worker) stops with it.

Runs on the real MNIST sample with a few steps an epoch: 20 Adam steps reach well above the
low target used here, so the target is met after epoch 1 of 3."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.test_training import Result, run_cli
from training import cli

pytestmark = pytest.mark.usefixtures("no_processes_left")

SHORT = ("--steps-per-epoch", "20", "--epochs", "3")
# Chance is 10%: twenty steps of Adam are far above this on every strategy.
LOW_TARGET = "0.3"

# Hogwild's (its own driver) and DeepSpeed's stops at target are checked on their main runs in
# test_training_strategies.py, which pass TARGET (assert_ended_at_target): a run of their own
# here cost each some 16 s of process start-up for the same check.
STRATEGIES = [
    pytest.param(("--strategy", "single"), id="single"),
    pytest.param(("--strategy", "ddp", "--nproc", "2"), id="ddp"),
]
TARGET = ("--target-accuracy", LOW_TARGET)


def reached_notes(result: Result) -> list[str]:
    return [e["message"] for e in result.of_type("log") if "Reached the target" in e["message"]]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_low_target_ends_the_run_after_epoch_one(
    sample_data: Path, strategy: tuple[str, ...]
) -> None:
    result = run_cli(sample_data, *strategy, *SHORT, *TARGET, "--run-id", "target")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_ended_at_target(result, epochs=3)


def assert_ended_at_target(result: Result, *, epochs: int) -> None:
    """A run of ``epochs`` epochs given TARGET met it after epoch 1 and ended there, saying so,
    every rank (or Hogwild worker) with it."""
    assert result.events[-1]["type"] == "finished"
    assert [e["epoch"] for e in result.of_type("epoch")] == [1]
    assert {s["epoch"] for s in result.of_type("step")} == {1}
    accuracy = result.of_type("epoch")[0]["test_accuracy"]
    assert accuracy >= float(LOW_TARGET)
    finished = result.finished
    assert (finished["epochs"], finished["epochs_run"]) == (epochs, 1)
    assert finished["steps"] == result.started["steps_per_epoch"]
    assert reached_notes(result) == [
        f"Reached the target test accuracy 30.00% at epoch 1 ({accuracy:.2%}): training ends "
        f"after epoch 1 of {epochs}."
    ]
    # Every rank left with rank 0: none outlived the launcher.
    assert not [pid for pid in result.started["pids"] if psutil.pid_exists(pid)]


def test_a_target_never_reached_trains_every_epoch(sample_data: Path) -> None:
    result = run_cli(
        sample_data, "--strategy", "ddp", "--nproc", "2", "--steps-per-epoch", "2",
        "--epochs", "2", "--target-accuracy", "1", "--run-id", "never",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [e["epoch"] for e in result.of_type("epoch")] == [1, 2]
    assert result.finished["epochs_run"] == 2
    assert reached_notes(result) == []


@pytest.mark.parametrize("value", ["0", "1.5", "nan", "high"])
def test_a_target_outside_zero_to_one_is_refused(
    sample_data: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--target-accuracy", value, "--data-dir", str(sample_data)])
    assert exc.value.code == 2
    assert "--target-accuracy" in capsys.readouterr().err
