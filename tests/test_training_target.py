"""Stop at target (``--target-accuracy``): after the first epoch whose test accuracy reaches it,
training ends normally, with a note saying so; every rank (or Hogwild worker) stops with it.

The checks live here; the runs they check are the strategies' main runs (below), and the
refusals of a target outside (0, 1] are here."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.test_training import Result
from training import cli

pytestmark = pytest.mark.usefixtures("no_processes_left")

# Chance is 10%: one epoch of the sample is far above this on every strategy.
LOW_TARGET = "0.3"
TARGET = ("--target-accuracy", LOW_TARGET)

# Each strategy's stop at target is checked on its main run, which passes TARGET with two epochs
# planned (assert_ended_at_target): single and DDP in test_training.py, Hogwild (its own
# driver) and DeepSpeed in test_training_strategies.py. A run of its own here cost each some
# 5-16 s of process start-up for the same check; the target never reached is checked on
# test_phases.py's DDP run without phases (assert_trained_every_epoch).


def reached_notes(result: Result) -> list[str]:
    return [e["message"] for e in result.of_type("log") if "Reached the target" in e["message"]]


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


def assert_trained_every_epoch(result: Result, *, epochs: int) -> None:
    """A run given a target it never reached trained every epoch planned, saying nothing of it."""
    assert result.returncode == 0, result.stderr[-3000:]
    assert [e["epoch"] for e in result.of_type("epoch")] == list(range(1, epochs + 1))
    assert result.finished["epochs_run"] == epochs
    assert reached_notes(result) == []
    assert not [pid for pid in result.started["pids"] if psutil.pid_exists(pid)]


@pytest.mark.parametrize("value", ["0", "1.5", "nan", "high"])
def test_a_target_outside_zero_to_one_is_refused(
    sample_data: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--target-accuracy", value, "--data-dir", str(sample_data)])
    assert exc.value.code == 2
    assert "--target-accuracy" in capsys.readouterr().err
