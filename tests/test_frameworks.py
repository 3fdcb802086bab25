"""Hugging Face, Lightning and TensorBoard scripts with no Trainyard line in them, launched as
the worker launches a script run: figures of every rank, a checkpoint asked for and a Stop,
agreed by the ranks and carried out through the frameworks' own controls, and resume; each
rank's step phases, seen by the observer.

Each script (tests/scripts/<name>/train.py) is copied with its data reader (fashion.py) into a
folder of its own, as a user's folder would be uploaded.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from tests.test_script_runs import Launched

SCRIPTS = Path(__file__).resolve().parent / "scripts"
FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
needs_fashion = pytest.mark.skipif(not FASHION.is_file(), reason="needs dataset-fashion-mnist")


def folder(tmp_path: Path, name: str) -> Path:
    code = tmp_path / name
    code.mkdir()
    shutil.copy(SCRIPTS / name / "train.py", code)
    shutil.copy(SCRIPTS / "fashion.py", code)
    return code


def stop_after_a_checkpoint(run: Launched) -> int:
    """Ask for a checkpoint once both ranks reported, then stop; returns the step both left at."""
    run.wait_for(lambda e: e["type"] == "metrics" and e["rank"] == 1 and e["step"] >= 2)
    run.process.send_signal(signal.SIGUSR1)
    asked = run.wait_for(lambda e: e["type"] == "checkpoint")
    assert asked["answers_request"] is True and Path(asked["path"]).exists()
    run.process.send_signal(signal.SIGTERM)
    assert run.end() == 143, run.stderr
    step = run.of_type("checkpoint")[-1]["step"]
    assert f"Stopped: 2 rank(s) left at step {step}." in [e["message"] for e in run.of_type("log")]
    return int(step)


def assert_observed(run: Launched) -> None:
    """The observer saw the framework's steps on both ranks (issue 33): windows of phases."""
    windows = run.of_type("step")
    assert windows, run.stderr
    for window in windows:
        assert [r["rank"] for r in window["ranks"]] == [0, 1]
    assert all(r["backward_seconds"] > 0 and r["forward_seconds"] > 0 for r in windows[-1]["ranks"])
    assert any(r["communication_bytes"] > 0 for w in windows for r in w["ranks"])


def loss_steps(run: Launched, rank: int, name: str) -> list[int]:
    return [e["step"] for e in run.of_type("metrics") if e["rank"] == rank and name in e["values"]]


@needs_fashion
def test_a_hugging_face_trainer_reports_each_rank_stops_agreed_and_resumes(
    tmp_path: Path,
) -> None:
    code = folder(tmp_path, "hf_trainer")
    run = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py", code=code,
                   args=["--max-steps", "1000", "--sleep", "0.2"])  # fmt: skip
    step = stop_after_a_checkpoint(run)
    assert_observed(run)
    # Each rank's own loss (the Trainer's logged one is the mean over ranks: loss_mean).
    ours = [e["values"]["loss"] for e in run.of_type("metrics") if "loss" in e["values"]]
    assert loss_steps(run, 0, "loss")[-1] == loss_steps(run, 1, "loss")[-1] == step
    assert len(set(ours)) > 1 and loss_steps(run, 0, "loss_mean")
    saved = Path(run.of_type("checkpoint")[-1]["path"])
    # In the run's checkpoint folder (its output_dir, "out", is relative), as a folder.
    assert saved == tmp_path / "checkpoints" / "out" / f"checkpoint-{step}"
    assert (saved / "trainer_state.json").is_file()

    again = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py", "--resume",
                     str(saved), code=code, args=["--max-steps", str(step + 2)])  # fmt: skip
    assert again.end() == 0, again.stderr
    assert loss_steps(again, 0, "loss") == loss_steps(again, 1, "loss") == [step + 1, step + 2]


@needs_fashion
def test_a_lightning_trainer_reports_each_rank_and_stops_agreed(tmp_path: Path) -> None:
    code = folder(tmp_path, "lightning_fit")
    run = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py", code=code,
                   args=["--max-steps", "1000", "--sleep", "0.2"])  # fmt: skip
    step = stop_after_a_checkpoint(run)
    assert_observed(run)
    assert loss_steps(run, 0, "train_loss") and loss_steps(run, 1, "train_loss")
    assert Path(run.of_type("checkpoint")[-1]["path"]).name == f"step-{step}.ckpt"


def test_summary_writer_scalars_become_series(tmp_path: Path) -> None:
    code = tmp_path / "tensorboard_scalars"
    shutil.copytree(SCRIPTS / "tensorboard_scalars", code)
    run = Launched(tmp_path, "--nproc", "1", "--entrypoint", "train.py", code=code, args=[])
    assert run.end() == 0, run.stderr
    assert loss_steps(run, 0, "train/loss") == loss_steps(run, 0, "weights/w") == [1, 2, 3, 4, 5]
    assert list((code / "runs").glob("events.out.tfevents.*"))  # its own file, as before
