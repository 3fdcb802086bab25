"""``byte-llama`` through the CLI on one process: the default size learns the Jargon File (its
bits per byte fall well below their start in 40 steps, about 25 s on 2 cores), every figure a
language model's events carry, the text it writes, the dry run, a text folder, and the
refusals, said before anything starts (exit 2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.test_training import Result, assert_well_formed, run_cli, run_cli_asking_checkpoint
from training import cli
from training.text_catalogue import TEXT_ROOTS_ENV

# The Jargon File comes from Debian's jargon-text, which .ci/system-packages installs.
pytestmark = pytest.mark.usefixtures("no_processes_left")


def _printable(text: str) -> float:
    """The share of characters that are letters, digits, punctuation or white space."""
    return sum(ch.isprintable() or ch in "\n\t" for ch in text) / max(len(text), 1)


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> Result:
    """The default size (small) on jargon: 2 epochs of 20 steps of 32 windows of 128 bytes."""
    result = run_cli(
        tmp_path_factory.mktemp("data"), "--model", "byte-llama", "--dataset", "jargon",
        "--epochs", "2", "--steps-per-epoch", "20", "--batch-size", "32", "--log-interval", "5",
        "--run-id", "lm",
    )  # fmt: skip
    assert_well_formed(result, "lm")
    return result


def test_the_default_size_learns_the_jargon_file(learned: Result) -> None:
    info = learned.started["model_info"]
    assert (info["model_size"], info["seq_len"], info["parameters"]) == ("small", 128, 869504)
    first = learned.of_type("step")[0]["train_loss"] / math.log(2)  # bits per byte, untrained
    epochs = learned.of_type("epoch")
    bits = [e["bits_per_byte"] for e in epochs]
    assert first > 7.5  # about 8: 256 byte values, none known yet
    assert bits[1] < bits[0] < first
    assert bits[1] < 0.65 * first, bits  # measured here: 8.76 -> 4.46
    for epoch in epochs:
        assert epoch["bits_per_byte"] == pytest.approx(epoch["test_loss"] / math.log(2), abs=1e-5)
        assert epoch["perplexity"] == pytest.approx(math.exp(epoch["test_loss"]), rel=1e-5)


def test_the_sample_is_text(learned: Result) -> None:
    samples = [e["sample"] for e in learned.of_type("epoch")]
    assert all(isinstance(s, str) and len(s) >= 150 for s in samples)
    # After 40 steps it writes letters and spaces, mostly; untrained it writes any of 256 bytes.
    assert _printable(samples[-1]) > 0.9, samples[-1]
    assert samples[0] != samples[1]


def _figures(event: dict[str, Any], seq_len: int) -> None:
    for figures in (event, *event["ranks"]):
        expected = figures["images_per_second"] * seq_len
        assert figures["tokens_per_second"] == pytest.approx(expected, rel=1e-3)
    assert 0 < event["mfu"] < 1
    assert event["grad_norm"] > 0


def test_steps_and_epochs_carry_tokens_mfu_and_grad_norm(learned: Result) -> None:
    started = learned.started
    assert started["peak_flops"] > 0
    assert started["peak_source"]  # "measured peak (...)" or $TRAINYARD_PEAK_FLOPS
    assert started["model_info"]["flops_per_token"] > 6 * 800_000
    for event in [*learned.of_type("step"), *learned.of_type("epoch")]:
        _figures(event, 128)
    epoch = learned.of_type("epoch")[-1]
    expected = epoch["tokens_per_second"] * started["model_info"]["flops_per_token"]
    assert epoch["mfu"] == pytest.approx(expected / started["peak_flops"], rel=1e-3)


def test_the_learning_rate_warms_up_then_decays(learned: Result) -> None:
    rates = {e["step"]: e["lr"] for e in learned.of_type("step")}
    assert rates[1] == pytest.approx(1e-3 / 2)  # a warm-up of 2 steps (5% of 40)
    assert max(rates.values()) <= 1e-3
    assert rates[40] == pytest.approx(1e-4)  # the cosine's end, a tenth of --lr
    assert any("warm-up over 2 step(s)" in note for note in learned.started["notes"])


def test_a_dry_run_trains_one_step_of_the_smoke_size(tmp_path: Path) -> None:
    result = run_cli(
        tmp_path, "--model", "byte-llama", "--model-size", "smoke", "--dataset", "jargon",
        "--dry-run", "--run-id", "dry",
    )  # fmt: skip
    assert_well_formed(result, "dry")
    assert result.finished["steps"] == 1
    (epoch,) = result.of_type("epoch")
    assert isinstance(epoch["sample"], str) and epoch["bits_per_byte"] > 0


def test_a_text_folder_under_the_text_roots_trains(tmp_path: Path) -> None:
    folder = tmp_path / "textfolders" / "notes"
    (folder / "train").mkdir(parents=True)
    (folder / "val").mkdir()
    (folder / "train" / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    (folder / "val" / "b.txt").write_text("a lazy dog sleeps under the quick brown fox. " * 10)
    result = run_cli(
        tmp_path, "--model", "byte-llama", "--model-size", "smoke", "--dataset", "textfolder",
        "--data-path", str(folder), "--steps-per-epoch", "2", "--run-id", "folder",
    )  # fmt: skip
    assert_well_formed(result, "folder")
    started = result.started
    assert started["data_path"] == str(folder.resolve())
    assert "train/val; 2 files" in started["dataset_source"]
    # 1,800 training bytes in windows of 32: 56 whole windows; 450 held out: 14.
    assert (started["train_size"], started["test_size"]) == (56, 14)


def test_a_stopped_run_resumes_and_its_loss_continues(tmp_path: Path) -> None:
    """Stopped mid-epoch as the dashboard stops to resume (SIGUSR1: a checkpoint at the next
    step), the run goes on from the step after it: the same windows (drawn from seed, step and
    rank alone), Adam's moments and the learning rate on its curve (set from the global step),
    so each later step's loss and rate and each evaluation are the uninterrupted run's. Asking
    for the checkpoint changes nothing in the run that wrote it: it is the reference."""
    args = (
        "--model", "byte-llama", "--model-size", "smoke", "--dataset", "jargon", "--epochs",
        "2", "--steps-per-epoch", "8", "--log-interval", "1", "--seed", "3",
    )  # fmt: skip
    asked = run_cli_asking_checkpoint(
        tmp_path, *args, "--checkpoint-dir", str(tmp_path / "asked"), "--run-id", "lm-stop"
    )
    assert_well_formed(asked, "lm-stop")
    [checkpoint] = [c for c in asked.of_type("checkpoint") if c["requested"]]
    stopped = checkpoint["step"]
    assert 1 <= stopped < 8, checkpoint  # mid-epoch 1: the resume draws the rest of it
    resumed = run_cli(
        tmp_path, *args, "--checkpoint-dir", str(tmp_path / "resumed"), "--run-id", "lm-go",
        "--resume", checkpoint["path"],
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert any(f"from its batch {stopped + 1}" in n for n in resumed.started["notes"])

    def steps(result: Result) -> dict[int, tuple[float, float]]:
        return {e["step"]: (e["train_loss"], e["lr"]) for e in result.of_type("step")}

    after = {k: v for k, v in steps(asked).items() if k > stopped}
    assert sorted(steps(resumed)) == sorted(after) and max(after) == 16
    for step, (loss, lr) in steps(resumed).items():
        assert loss == pytest.approx(after[step][0], abs=1e-5), step
        assert lr == pytest.approx(after[step][1], rel=1e-9), step
    for mine, theirs in zip(resumed.of_type("epoch"), asked.of_type("epoch"), strict=True):
        assert mine["test_loss"] == pytest.approx(theirs["test_loss"], abs=1e-5)
        assert mine["bits_per_byte"] == pytest.approx(theirs["bits_per_byte"], abs=2e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "byte-llama", "--dataset", "mnist"],
         "byte-llama is a language model and trains on text (jargon or textfolder)"),
        (["--dataset", "jargon"], "--dataset jargon is text, which trains a language model"),
        (["--model", "byte-llama", "--dataset", "jargon", "--strategy", "hogwild"],
         "hogwild does not train language models (byte-llama) yet"),
        (["--model", "byte-llama", "--dataset", "jargon", "--strategy", "tensor-parallel",
          "--nproc", "3"],
         "argument --nproc: tensor-parallel splits byte-llama (small) over 3 tensor-parallel "
         "ranks, and its number of heads, 4, is not a multiple of 3"),
        (["--model", "byte-llama", "--dataset", "jargon", "--strategy", "tensor-parallel",
          "--nproc", "2", "--seq-len", "33"],
         "argument --seq-len: tensor-parallel splits byte-llama (small) over 2 tensor-parallel "
         "ranks, and its window (--seq-len), 33, is not a multiple of 2"),
        (["--model", "byte-llama", "--dataset", "jargon", "--strategy", "pipeline", "--nproc",
          "5"], "the model has 4 layers; got --nproc 5 (5 stages: more stages than layers)"),
        (["--model", "byte-llama", "--dataset", "jargon", "--strategy", "pipeline", "--nproc",
          "4", "--microbatches", "2", "--batch-size", "8"],
         "argument --microbatches: 2 micro-batches are fewer than the 4 stages"),
        (["--model", "byte-llama", "--dataset", "jargon", "--strategy", "pipeline", "--nproc",
          "3", "--pipeline-schedule", "zero-bubble", "--microbatches", "3", "--batch-size", "6"],
         "pipeline runs 2 stages a rank (zero-bubble), cut by layer, and the model has 4 layers; "
         "got --nproc 3 (6 stages: more stages than layers)"),
        (["--model", "byte-llama", "--dataset", "jargon", "--sequence-parallel"],
         "argument --sequence-parallel: applies to --strategy tensor-parallel or fsdp-tp only"),
        (["--model-size", "smoke"], "argument --model-size: only with a language model"),
        (["--seq-len", "64"], "argument --seq-len: only with a language model"),
        (["--model", "byte-llama", "--dataset", "textfolder", "--data-path", "/"],
         "argument --data-path: / is not under the text folders' roots"),
    ],
)  # fmt: skip
def test_the_cli_refuses_before_anything_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv(TEXT_ROOTS_ENV, raising=False)
    with pytest.raises(SystemExit) as exc:
        cli.main([*args, "--data-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
