"""``fsdp`` (FSDP2, ``fully_shard``): the same training as DDP at the same global batch, half the
parameters per rank, and checkpoints that are the plain model's.

One configuration, as tests/test_exactness.py's but shorter: SGD with momentum (its state is
sharded too), 2 ranks of 32, one epoch of 4 steps. FSDP2 reduce-scatters the gradients where DDP
all-reduces them (both average over ranks), so sums are taken in another order: we require DDP's
tolerance against single, 1e-5 (relative to each tensor's norm; losses absolute).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.test_exactness import assert_same_parameters
from tests.test_training import Result, assert_ran, run_cli
from training.config import parse_args

STEPS = 4
COMMON = (
    "--optimizer", "sgd", "--lr", "0.01", "--seed", "7", "--steps-per-epoch", str(STEPS),
    "--log-interval", "1",
)  # fmt: skip
TWO_RANKS = ("--nproc", "2", "--batch-size", "32")

# Each torchrun run takes 10-20 s on a loaded 2-core machine; the module runs four.
pytestmark = [pytest.mark.usefixtures("no_processes_left"), pytest.mark.slow]


def _run(sample_data: Path, out: Path, run_id: str, *args: str, resumed: bool = False) -> Result:
    result = run_cli(sample_data, *COMMON, "--checkpoint-dir", str(out), "--run-id", run_id, *args)
    assert_ran(result, run_id, resumed=resumed)
    return result


@pytest.fixture(scope="module")
def ddp(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("ddp")
    return _run(sample_data, out, "ddp", "--strategy", "ddp", "--epochs", "1", *TWO_RANKS)


@pytest.fixture(scope="module")
def fsdp(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("fsdp")
    return _run(sample_data, out, "fsdp", "--strategy", "fsdp", "--epochs", "1", *TWO_RANKS)


def _checkpoint(result: Result) -> Path:
    return Path(result.of_type("checkpoint")[-1]["path"])


def _losses(result: Result) -> list[float]:
    return [e["train_loss"] for e in result.of_type("step")]


def test_fsdp_two_ranks_equal_ddp_two_ranks(ddp: Result, fsdp: Result) -> None:
    assert fsdp.started["strategy"] == "fsdp" and fsdp.started["world_size"] == 2
    assert any("fully_shard" in n and "50%" in n for n in fsdp.started["notes"])
    assert len(_losses(fsdp)) == STEPS
    assert _losses(fsdp) == pytest.approx(_losses(ddp), abs=1e-5)
    assert_same_parameters(_checkpoint(fsdp), _checkpoint(ddp), rtol=1e-5)


def test_fsdp_ranks_hold_half_of_ddp_parameters(ddp: Result, fsdp: Result) -> None:
    (ddp_epoch,), (fsdp_epoch,) = ddp.of_type("epoch"), fsdp.of_type("epoch")
    assert [m["rank"] for m in fsdp_epoch["memory"]] == [0, 1]
    for full, shard in zip(ddp_epoch["memory"], fsdp_epoch["memory"], strict=True):
        for field in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"):
            # Dim-0 shards: an odd first dimension (none here) would make it not quite half.
            assert 0.45 < shard[field] / full[field] < 0.55, field
        assert shard["peak_bytes"] > 0
    # SGD's momentum is one buffer per parameter: as many bytes as the parameters.
    assert (
        ddp_epoch["memory"][0]["optimizer_state_bytes"] == ddp_epoch["memory"][0]["parameter_bytes"]
    )


def test_fsdp_checkpoint_resumes_under_fsdp_and_under_single(
    sample_data: Path, fsdp: Result, tmp_path: Path
) -> None:
    """Both continue from the same whole state, so they end alike; a momentum FSDP2 had not
    taken back would part them."""
    resume = ("--epochs", "2", "--resume", str(_checkpoint(fsdp)))
    again = _run(
        sample_data, tmp_path / "fsdp", "r-fsdp", "--strategy", "fsdp", *TWO_RANKS, *resume,
        resumed=True,
    )  # fmt: skip
    single = _run(
        sample_data, tmp_path / "single", "r-single", "--strategy", "single",
        "--batch-size", "64", *resume, resumed=True,
    )  # fmt: skip
    for result in (again, single):
        assert result.started["start_epoch"] == 2
        assert not any("afresh" in note for note in result.started["notes"])
    assert any("sharded over the ranks" in note for note in again.started["notes"])
    assert_same_parameters(_checkpoint(again), _checkpoint(single), rtol=1e-5)


@pytest.mark.parametrize("strategy", ["ddp", "single"])
def test_no_reshard_after_forward_is_refused_elsewhere(
    strategy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--strategy", strategy, "--no-reshard-after-forward"])
    assert exc.value.code == 2
    assert "applies to --strategy fsdp only" in capsys.readouterr().err
    assert not parse_args(
        ["--strategy", "fsdp", "--no-reshard-after-forward"]
    ).reshard_after_forward
