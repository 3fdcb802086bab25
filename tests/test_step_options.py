"""The step's options (``--accumulate``, ``--precision``, ``--compile``), each checked against the
plain fp32 step it must equal or stay near.

One configuration, as tests/test_exactness.py's but shorter: SGD with momentum, lr 0.01, seed 7,
steps of 64 images (``single`` with batches of 64 is the reference), ``STEPS`` optimizer steps an
epoch, a step event for each.

- ``--accumulate 2`` trains on the very images of each step of 64 (``rank_batches``), so
  ``single`` with 2 batches of 32 a step, ``ddp`` with 2 ranks x 2 batches of 16 and ``fsdp`` the
  same must end where their one-batch runs do. The micro-batches' means are added weighted by
  their share where the reference takes one mean, so float32 sums are taken in another order:
  1e-5 relative to each tensor's norm, as DDP against single.
- ``--precision bf16`` (autocast; FSDP2's MixedPrecisionPolicy) rounds activations to 8 bits of
  mantissa: its losses must differ from fp32's (it ran) by well over float32's noise, and its
  test accuracy stay within ``BF16_MARGIN`` of fp32's after the same steps.
- ``--compile``: inductor fuses and reorders float32 arithmetic, so losses within 1e-4 and
  parameters 1e-4 relative; one compiled run only (compiling takes a minute on 2 loaded cores),
  resumed from the reference's uncompiled checkpoint, its own checkpoint in the plain keys.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.test_exactness import assert_same_parameters
from tests.test_training import Result, assert_ran, run_cli
from training.config import parse_args
from training.data.batching import global_batches, rank_batches, steps_per_epoch
from training.models.simple_cnn import SimpleCNN
from training.strategies.common import step_default
from training.strategies.stepping import StepOptions, autocast_for, scaler_for

STEPS = 8
COMMON = (
    "--optimizer", "sgd", "--lr", "0.01", "--seed", "7", "--steps-per-epoch", str(STEPS),
    "--log-interval", "1",
)  # fmt: skip
BF16_MARGIN = 0.03  # test accuracy, fp32's minus bf16's, after the same STEPS steps
TWO_RANKS = ("--nproc", "2")
# Every run the module compares, trained once each, when a test first asks for it.
PLANS = {
    "single": ("--strategy", "single", "--batch-size", "64", "--epochs", "2"),
    "single-acc": ("--strategy", "single", "--batch-size", "32", "--accumulate", "2"),
    "ddp": ("--strategy", "ddp", *TWO_RANKS, "--batch-size", "32"),
    "ddp-acc": ("--strategy", "ddp", *TWO_RANKS, "--batch-size", "16", "--accumulate", "2"),
    "fsdp-acc": ("--strategy", "fsdp", *TWO_RANKS, "--batch-size", "16", "--accumulate", "2"),
    # bf16 under DDP (autocast, the path single takes too) and FSDP2 (its own policy). Not on
    # single: with two threads, bfloat16 convolutions are 5x slower than float32's on a CPU
    # without native bfloat16 (150 s for this run on the loaded machine, ddp's 25 s).
    "ddp-bf16": ("--strategy", "ddp", *TWO_RANKS, "--batch-size", "32", "--precision", "bf16"),
    "fsdp-bf16": ("--strategy", "fsdp", *TWO_RANKS, "--batch-size", "32", "--precision", "bf16"),
}
Runs = Callable[[str], Result]

pytestmark = pytest.mark.usefixtures("no_processes_left")
slow = pytest.mark.slow


def _run(sample_data: Path, out: Path, run_id: str, *args: str) -> Result:
    result = run_cli(sample_data, *COMMON, "--checkpoint-dir", str(out), "--run-id", run_id, *args)
    assert_ran(result, run_id, resumed="--resume" in args)
    return result


@pytest.fixture(scope="module")
def runs(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """name -> its run's events, trained on first use (so each test's time is its own runs')."""
    done: dict[str, Result] = {}

    def run(name: str) -> Result:
        if name not in done:
            done[name] = _run(sample_data, tmp_path_factory.mktemp(name), name, *PLANS[name])
        return done[name]

    return run


def _relative_differences(a: Path, b: Path) -> dict[str, float]:
    """Each parameter's difference, relative to its norm in ``b``."""
    pa, pb = (torch.load(path, weights_only=True)["model"] for path in (a, b))
    return {name: float((pa[name] - pb[name]).norm() / pb[name].norm()) for name in pb}


def _checkpoint(result: Result, epoch: int = 1) -> Path:
    return Path(next(c["path"] for c in result.of_type("checkpoint") if c["epoch"] == epoch))


def _losses(result: Result, epoch: int = 1) -> list[float]:
    return [e["train_loss"] for e in result.of_type("step") if e["epoch"] == epoch]


# --- which images a step takes ------------------------------------------------------------------


def test_a_step_of_k_batches_holds_the_images_of_one_k_times_larger() -> None:
    n, seed = 4000, 7
    for world in (1, 2):
        for rank in range(world):
            big = rank_batches(n, 64, world, rank, seed, 1)
            accumulated = rank_batches(n, 16, world, rank, seed, 1, accumulate=4)
            assert len(big) == len(accumulated) == steps_per_epoch(n, 16, world, None, 4)
            assert all(torch.equal(a, b) for a, b in zip(big, accumulated, strict=True))


def test_a_short_last_step_keeps_two_images_for_every_micro_batch_of_every_rank() -> None:
    # 4000 = 62 x 64 + 32: the last 32 images over 2 ranks x 8 micro-batches are 2 each ...
    assert len(global_batches(4000, 64, 7, 1, world_size=2, accumulate=8)) == 63
    for rank in (0, 1):
        last = rank_batches(4000, 4, 2, rank, 7, 1, accumulate=8)[-1]
        assert [len(piece) for piece in last.tensor_split(8)] == [2] * 8
    # ... over 2 x 16 they would be 1 each: a BatchNorm model cannot train on that.
    assert len(global_batches(4000, 64, 7, 1, world_size=2, accumulate=16)) == 62
    # Batches of 1 are what the user asked for: one image per micro-batch, none empty.
    assert steps_per_epoch(9, 1, 1, None, accumulate=4) == 2


def _twins() -> tuple[list[SimpleCNN], list[torch.optim.Optimizer]]:
    torch.manual_seed(0)
    models = [SimpleCNN(), SimpleCNN()]
    models[1].load_state_dict(models[0].state_dict())
    return models, [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]


def test_uneven_micro_batches_are_weighted_by_their_share() -> None:
    """A short last step cuts 10 images into 4, 3 and 3: each mean weighted by its share is the
    mean over the 10 (weighting each by a third would not be)."""
    (plain, pieces), (plain_opt, pieces_opt) = _twins()
    x, y = torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,))
    whole = step_default(plain, plain_opt)(x, y)
    summed = step_default(pieces, pieces_opt, StepOptions(accumulate=3))(x, y)
    assert float(summed) == pytest.approx(float(whole), abs=1e-6)
    for a, b in zip(plain.parameters(), pieces.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_the_fp16_step_scales_its_loss_and_unscales_before_the_update() -> None:
    """The CLI refuses fp16 on the CPU (a GPU's precision), but torch runs it here: the step's
    own scaler path, checked where no GPU is."""
    (plain, scaled), (plain_opt, scaled_opt) = _twins()
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    cpu = torch.device("cpu")
    scaler = scaler_for("fp16", cpu)
    assert scaler is not None and scaler_for("bf16", cpu) is None
    options = StepOptions(autocast=autocast_for("fp16", cpu), scaler=scaler)
    step_default(plain, plain_opt)(x, y)
    step_default(scaled, scaled_opt, options)(x, y)
    # The loss went backward scaled by 2**16 and the step was taken (no overflow) ...
    assert scaler.get_scale() == 2.0**16 and scaler.state_dict()["_growth_tracker"] == 1
    # ... after unscaling: fp32's update to float16's rounding, not 65,536 times it.
    for a, b in zip(plain.parameters(), scaled.parameters(), strict=True):
        assert float((a - b).detach().norm() / a.detach().norm()) < 1e-2


# --- refused where they cannot run, in the registry's words -------------------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--strategy", "fsdp", "--compile"], "--compile: applies to --strategy single or ddp"),
        (["--strategy", "hogwild", "--accumulate", "2"], "--accumulate: applies to --strategy"),
        (["--strategy", "single", "--precision", "fp16"], "runs on GPUs only (--gpus)"),
    ],
)
def test_the_step_options_are_refused_where_they_cannot_run(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert said in capsys.readouterr().err


# --- accumulation -------------------------------------------------------------------------------


@slow
def test_single_accumulating_2_batches_of_32_equals_single_at_64(runs: Runs) -> None:
    single, accumulated = runs("single"), runs("single-acc")
    started = accumulated.started
    assert (started["accumulate"], started["global_batch_size"]) == (2, 64)
    assert started["steps_per_epoch"] == STEPS  # optimizer steps, each of 2 batches
    assert any("adds up the gradients of 2 batches of 32" in n for n in started["notes"])
    assert _losses(accumulated) == pytest.approx(_losses(single), abs=1e-5)
    assert_same_parameters(_checkpoint(accumulated), _checkpoint(single), rtol=1e-5)


@slow
def test_ddp_accumulating_equals_ddp_at_twice_the_batch(runs: Runs) -> None:
    ddp, accumulated = runs("ddp"), runs("ddp-acc")
    assert accumulated.started["global_batch_size"] == ddp.started["global_batch_size"] == 64
    assert any(
        "reduced over the ranks once, after the last" in n for n in accumulated.started["notes"]
    )
    assert _losses(accumulated) == pytest.approx(_losses(ddp), abs=1e-5)
    assert_same_parameters(_checkpoint(accumulated), _checkpoint(ddp), rtol=1e-5)
    # And both are the single process's step at 64.
    assert_same_parameters(_checkpoint(accumulated), _checkpoint(runs("single")), rtol=1e-5)


@slow
def test_fsdp_accumulating_equals_single_at_the_global_batch(runs: Runs) -> None:
    accumulated = runs("fsdp-acc")
    assert any("reduced over the ranks once" in n for n in accumulated.started["notes"])
    assert _losses(accumulated) == pytest.approx(_losses(runs("single")), abs=1e-5)
    assert_same_parameters(_checkpoint(accumulated), _checkpoint(runs("single")), rtol=1e-5)


# --- precision ----------------------------------------------------------------------------------


@slow
@pytest.mark.parametrize("name", ["ddp-bf16", "fsdp-bf16"])
def test_bf16_trains_near_fp32_with_other_losses(runs: Runs, name: str) -> None:
    bf16, fp32 = runs(name), runs("ddp")
    assert bf16.started["precision"] == "bf16"
    assert any("bf16" in n and "float32" in n for n in bf16.started["notes"])
    # It ran in bfloat16: its gradients are off by 0.2-9% (relative, per tensor), so after
    # STEPS steps the parameters part by far more than float32's order of sums parts them (1e-7
    # here, 1e-5 allowed above); the mean losses, averaging the rounding out, by less.
    parted = _relative_differences(_checkpoint(bf16), _checkpoint(fp32))
    assert max(parted.values()) > 1e-3, parted
    differences = [abs(a - b) for a, b in zip(_losses(bf16), _losses(fp32), strict=True)]
    assert max(differences) > 1e-5, differences
    accuracy = bf16.of_type("epoch")[0]["test_accuracy"]
    expected = fp32.of_type("epoch")[0]["test_accuracy"]
    assert accuracy > 0.3 and abs(accuracy - expected) <= BF16_MARGIN, (accuracy, expected)
    # Checkpoints keep float32 weights.
    state = torch.load(_checkpoint(bf16), weights_only=True)["model"]
    assert {t.dtype for t in state.values()} == {torch.float32}


# --- compile ------------------------------------------------------------------------------------


@slow
def test_a_compiled_run_equals_the_eager_one_and_reports_its_compile_time(
    runs: Runs, sample_data: Path, tmp_path: Path
) -> None:
    eager = runs("single")
    # Compiled, resuming the reference's uncompiled epoch 1: its epoch 2 must be the reference's.
    compiled = _run(
        sample_data, tmp_path, "compiled", *PLANS["single"], "--compile",
        "--resume", str(_checkpoint(eager, 1)),
    )  # fmt: skip
    assert compiled.started["compile"] is True and compiled.started["start_epoch"] == 2
    assert _losses(compiled, 2) == pytest.approx(_losses(eager, 2), abs=1e-4)
    (epoch,) = compiled.of_type("epoch")
    first = compiled.of_type("step")[0]
    assert epoch["compile_seconds"] >= first["compile_seconds"] > 0
    # Taken out of the first step's compute time: what is left is a step, not a compile.
    assert first["compute_seconds"] < first["compile_seconds"]
    assert not any("compile_seconds" in e for e in eager.events)
    assert any("torch.compile took" in e["message"] for e in compiled.of_type("log"))
    # The checkpoint holds the plain model's keys (no _orig_mod.): it loads uncompiled.
    saved = _checkpoint(compiled, 2)
    SimpleCNN().load_state_dict(torch.load(saved, weights_only=True)["model"])
    assert_same_parameters(saved, _checkpoint(eager, 2), rtol=1e-4)
