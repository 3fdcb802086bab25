"""Exactness and resume: strategies that should compute the same thing do, to float tolerance.

One configuration, 2 epochs of 10 optimizer steps with SGD (deterministic, unlike nothing else
here: no dropout, no data-order randomness beyond the seeded per-epoch permutation):

- ``single`` with batches of 64 is the reference;
- ``ddp`` with 2 ranks of 32 is fed the two halves of each of those batches of 64
  (``training.data.batching.rank_batches``), and must end with the same parameters;
- ``hogwild`` with 1 worker process trains the shared model on exactly the reference's batches;
- a run resumed from either one's epoch-1 checkpoint must end where the uninterrupted run did.

Tolerance: DDP averages two gradients of 32 (each a mean, reduced over Gloo) where the
reference takes one mean of 64, and its ranks run one thread each where the reference runs
several, so float32 sums are taken in a different order; over 20 steps that moves parameters by
about 1e-7 relative. We require 1e-5 relative to each tensor's norm. Processes that run the same
operations in the same order (resume, Hogwild with one worker) must agree to 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import need
from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.test_training import (
    Result,
    assert_well_formed,
    run_cli,
    run_cli_asking_checkpoint,
)
from training import cli
from training.data.batching import epoch_order, global_batches, rank_batches, steps_per_epoch

STEPS, EPOCHS = 10, 2
COMMON = (
    "--optimizer",
    "sgd",
    "--lr",
    "0.01",
    "--seed",
    "7",
    "--epochs",
    str(EPOCHS),
    "--steps-per-epoch",
    str(STEPS),
    "--log-interval",
    "5",
)


# Slow: each test trains (often twice, with torchrun) and compares every parameter; 60-100 s
# apiece on a loaded 2-core machine. The two pure tests of the batch split are not marked.
pytestmark = pytest.mark.usefixtures("no_processes_left")
slow = pytest.mark.slow


def _params(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(path, weights_only=True)["model"]
    return state


def assert_same_parameters(a: Path, b: Path, rtol: float) -> None:
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        diff = float((pa[name] - pb[name]).norm() / pb[name].norm().clamp_min(1e-12))
        assert diff <= rtol, f"{name}: relative difference {diff:.2e} > {rtol:.0e}"


def _run(sample_data: Path, out: Path, run_id: str, *args: str) -> Result:
    result = run_cli(sample_data, *COMMON, "--checkpoint-dir", str(out), "--run-id", run_id, *args)
    assert_well_formed(result, run_id)
    return result


@pytest.fixture(scope="module")
def reference_run(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("single-64")
    result = _run(sample_data, out, "ref", "--strategy", "single", "--batch-size", "64")
    assert result.started["global_batch_size"] == 64
    assert [c["epoch"] for c in result.of_type("checkpoint")] == [1, 2]
    return result


@pytest.fixture(scope="module")
def reference(reference_run: Result) -> Path:
    """The reference run's checkpoint folder."""
    return Path(reference_run.of_type("checkpoint")[0]["path"]).parent


@pytest.fixture(scope="module")
def ddp_run(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp-2x32")
    ddp = ("--strategy", "ddp", "--nproc", "2", "--batch-size", "32")
    result = _run(sample_data, out, "ddp", *ddp)
    assert (result.started["world_size"], result.started["global_batch_size"]) == (2, 64)
    return out


# --- the batch order, through the public functions -------------------------------------------


def test_rank_batches_are_the_halves_of_the_global_batches() -> None:
    n, seed = 4000, 7
    for epoch in (1, 2):
        full = global_batches(n, 64, seed, epoch)
        halves = [rank_batches(n, 32, 2, r, seed, epoch) for r in (0, 1)]
        assert len(full) == len(halves[0]) == len(halves[1]) == steps_per_epoch(n, 32, 2, None)
        for g, a, b in zip(full, *halves, strict=True):
            assert torch.equal(torch.cat([a, b]), g)
        # One rank of one is the single process's order; every image once per epoch.
        single = rank_batches(n, 64, 1, 0, seed, epoch)
        assert all(torch.equal(a, b) for a, b in zip(single, full, strict=True))
        assert torch.equal(torch.cat(full).sort().values, torch.arange(n))
    assert not torch.equal(epoch_order(n, seed, 1), epoch_order(n, seed, 2))


def test_a_short_last_global_batch_is_split_evenly_or_dropped() -> None:
    # 100 = 64 + 36: the last global batch is split 18 / 18.
    assert [len(b) for b in rank_batches(100, 32, 2, 1, 0, 1)] == [32, 18]
    assert steps_per_epoch(100, 32, 2, None) == 2
    # 65 = 64 + 1: one image cannot be split over two ranks; it is left out.
    assert [len(b) for b in rank_batches(65, 32, 2, 0, 0, 1)] == [32]
    assert steps_per_epoch(65, 32, 2, None) == 1
    assert steps_per_epoch(4000, 64, 1, 5) == 5


# --- exactness ---------------------------------------------------------------------------------


@slow
def test_ddp_two_ranks_of_32_equal_one_process_of_64(reference: Path, ddp_run: Path) -> None:
    assert_same_parameters(ddp_run / "epoch-2.pt", reference / "epoch-2.pt", rtol=1e-5)
    # And not trivially: training moved the parameters.
    start = _params(reference / "epoch-1.pt")
    end = _params(reference / "epoch-2.pt")
    assert any(not torch.allclose(start[k], end[k]) for k in start)


@slow
def test_hogwild_with_one_worker_equals_single(
    sample_data: Path, reference: Path, tmp_path: Path
) -> None:
    result = _run(
        sample_data,
        tmp_path,
        "hw1",
        "--strategy",
        "hogwild",
        "--nproc",
        "1",
        "--batch-size",
        "64",
        "--keep-checkpoints",
        "1",
    )
    assert result.started["world_size"] == 1
    # Written each epoch, the older one deleted (--keep-checkpoints 1).
    assert [c["epoch"] for c in result.of_type("checkpoint")] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-2.pt"]
    # Worker 0's optimizer state, sent to the parent for the checkpoint.
    state = torch.load(tmp_path / "epoch-2.pt", weights_only=True)
    assert state["optimizer"]["state"] and state["step"] == 2 * STEPS
    params = [t for t in result.started["shared_tensors"] if t["name"].startswith("model.")]
    assert params and all(t["is_shared"] for t in params)
    assert_same_parameters(tmp_path / "epoch-2.pt", reference / "epoch-2.pt", rtol=1e-6)


# --- resume ------------------------------------------------------------------------------------


@slow
def test_single_resumed_equals_uninterrupted(
    sample_data: Path, reference: Path, reference_run: Result, tmp_path: Path
) -> None:
    state = torch.load(reference / "epoch-1.pt", weights_only=True)
    assert {"model", "optimizer", "epoch", "step", "rng", "config"} <= state.keys()
    assert (state["epoch"], state["step"], state["config"]["batch_size"]) == (1, STEPS, 64)
    resumed = run_cli(
        sample_data,
        *COMMON,
        "--batch-size",
        "64",
        "--checkpoint-dir",
        str(tmp_path),
        "--resume",
        str(reference / "epoch-1.pt"),
        "--run-id",
        "r1",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.started["start_epoch"] == 2
    assert [s["epoch"] for s in resumed.of_type("step")] == [2, 2]
    assert [s["step"] for s in resumed.of_type("step")] == [STEPS + 5, 2 * STEPS]
    assert resumed.finished["steps"] == 2 * STEPS
    assert_same_parameters(tmp_path / "epoch-2.pt", reference / "epoch-2.pt", rtol=1e-6)
    expected = reference_run.finished
    assert resumed.finished["test_accuracy"] == expected["test_accuracy"]
    assert resumed.finished["test_loss"] == pytest.approx(expected["test_loss"], rel=1e-5)


@slow
def test_ddp_resumed_equals_uninterrupted(sample_data: Path, ddp_run: Path, tmp_path: Path) -> None:
    resumed = run_cli(
        sample_data,
        *COMMON,
        "--strategy",
        "ddp",
        "--nproc",
        "2",
        "--batch-size",
        "32",
        "--checkpoint-dir",
        str(tmp_path),
        "--resume",
        str(ddp_run / "epoch-1.pt"),
        "--run-id",
        "r2",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.started["start_epoch"] == 2
    assert resumed.finished["steps"] == 2 * STEPS
    assert_same_parameters(tmp_path / "epoch-2.pt", ddp_run / "epoch-2.pt", rtol=1e-6)


# --- checkpoints on request (SIGUSR1), mid-epoch -----------------------------------------------


def _requested_checkpoint(result: Result, zero_partitions: int = 0) -> Path:
    """The one checkpoint the run wrote on request: mid-epoch 1, kept whatever the retention."""
    requested = [c for c in result.of_type("checkpoint") if c["requested"]]
    assert len(requested) == 1, result.of_type("checkpoint")
    event = requested[0]
    assert event["epoch"] == 1 and 1 <= event["step"] < STEPS, event
    path = Path(event["path"])
    assert path.name == f"step-{event['step']}.pt" and path.is_file()
    state = torch.load(path, weights_only=True)
    assert state["step"] == event["step"] and state["epoch"] == 1
    assert state["images_into_epoch"] == event["step"] * 64
    if zero_partitions:
        partitions = state["optimizer"]["zero_partitions"]
        assert len(partitions) == zero_partitions
        assert all(p["base_optimizer_state"]["state"] for p in partitions), "momentum missing"
    else:
        assert state["optimizer"]["state"], "the optimizer's momentum must be in it"
    return path


def _resume_from_requested(
    sample_data: Path, checkpoint: Path, out: Path, run_id: str, *args: str
) -> Result:
    step = int(checkpoint.stem.split("-")[1])
    resumed = _run(sample_data, out, run_id, "--resume", str(checkpoint), *args)
    assert resumed.started["start_epoch"] == 1
    assert any(f"from its batch {step + 1}" in n for n in resumed.started["notes"])
    steps = [s["step"] for s in resumed.of_type("step")]
    assert steps[0] > step and steps[-1] == 2 * STEPS
    assert resumed.finished["steps"] == 2 * STEPS
    return resumed


@slow
def test_single_checkpoint_on_request_resumes_exactly(
    sample_data: Path, reference: Path, reference_run: Result, tmp_path: Path
) -> None:
    asked = tmp_path / "asked"
    result = run_cli_asking_checkpoint(
        sample_data, *COMMON, "--batch-size", "64", "--checkpoint-dir", str(asked),
        "--keep-checkpoints", "1", "--run-id", "ask1",
    )  # fmt: skip
    assert_well_formed(result, "ask1")
    requested = _requested_checkpoint(result)
    # Writing it changed nothing in the run; the retention left it alone.
    assert_same_parameters(asked / "epoch-2.pt", reference / "epoch-2.pt", rtol=1e-6)
    assert sorted(p.name for p in asked.iterdir()) == ["epoch-2.pt", requested.name]

    resumed = _resume_from_requested(
        sample_data, requested, tmp_path / "resumed", "ask1r", "--batch-size", "64"
    )
    assert_same_parameters(tmp_path / "resumed" / "epoch-2.pt", reference / "epoch-2.pt", 1e-6)
    assert resumed.finished["test_accuracy"] == reference_run.finished["test_accuracy"]


@slow
def test_ddp_checkpoint_on_request_resumes_exactly(
    sample_data: Path, ddp_run: Path, tmp_path: Path
) -> None:
    ddp = ("--strategy", "ddp", "--nproc", "2", "--batch-size", "32")
    # Sent to torchrun and both ranks, as a batch scheduler would: rank 0 answers, none dies.
    result = run_cli_asking_checkpoint(
        sample_data, *COMMON, *ddp, "--checkpoint-dir", str(tmp_path / "asked"), "--run-id", "ask2",
        everyone=True,
    )  # fmt: skip
    assert_well_formed(result, "ask2")
    # Rank 0 takes requests: the first rank, not the torchrun launcher.
    assert result.started["requests_pid"] == result.started["pids"][0] != result.pid
    requested = _requested_checkpoint(result)
    _resume_from_requested(sample_data, requested, tmp_path / "resumed", "ask2r", *ddp)
    assert_same_parameters(tmp_path / "resumed" / "epoch-2.pt", ddp_run / "epoch-2.pt", 1e-6)


@slow
def test_hogwild_checkpoint_on_request_resumes_exactly(
    sample_data: Path, reference: Path, tmp_path: Path
) -> None:
    hogwild = ("--strategy", "hogwild", "--nproc", "1", "--batch-size", "64")
    result = run_cli_asking_checkpoint(
        sample_data, *COMMON, *hogwild, "--checkpoint-dir", str(tmp_path / "asked"),
        "--run-id", "ask3", everyone=True,
    )  # fmt: skip
    assert_well_formed(result, "ask3")
    # The parent takes requests; worker 0 sends it its model and optimizer at a step boundary.
    assert result.started["requests_pid"] == result.pid not in result.started["pids"]
    requested = _requested_checkpoint(result)
    _resume_from_requested(sample_data, requested, tmp_path / "resumed", "ask3r", *hogwild)
    assert_same_parameters(tmp_path / "resumed" / "epoch-2.pt", reference / "epoch-2.pt", 1e-6)


@slow
def test_deepspeed_resumes_zero_optimizer_state_exactly(sample_data: Path, tmp_path: Path) -> None:
    """ZeRO partitions the optimizer state over the ranks: a checkpoint gathers every rank's
    partition, and a resumed run gives each rank its own back (momentum included)."""
    need(cli.deepspeed_available(), "deepspeed is not installed (pip install -e '.[deepspeed]')")
    zero = ("--strategy", "deepspeed", "--nproc", "2", "--batch-size", "32")
    asked = tmp_path / "asked"
    result = run_cli_asking_checkpoint(
        sample_data, *COMMON, *zero, "--checkpoint-dir", str(asked), "--run-id", "ask4", timeout=400
    )
    assert_well_formed(result, "ask4")
    requested = _requested_checkpoint(result, zero_partitions=2)
    resumed = _resume_from_requested(sample_data, requested, tmp_path / "resumed", "ask4r", *zero)
    notes = resumed.started["notes"]
    assert any("ZeRO's optimizer state resumed: 2 partitions" in n for n in notes), notes
    assert_same_parameters(tmp_path / "resumed" / "epoch-2.pt", asked / "epoch-2.pt", 1e-6)


# --- requests at the edges, in this process (the flag set by a real SIGUSR1 to ourselves) ----


def _train_here(sample_data: Path, *args: str, ask: bool = False) -> Result:
    import io
    import json
    import os
    import signal

    from training import engine
    from training.config import parse_args
    from training.process import runtime
    from training.process.run_requests import checkpoint_request_take, requests_install
    from training.protocol import EventWriter

    cfg = parse_args(["--data-dir", str(sample_data), "--run-id", "here", *COMMON[:6], *args])
    previous = signal.getsignal(signal.SIGUSR1)
    requests_install()
    buffer = io.StringIO()
    try:
        if ask:
            os.kill(os.getpid(), signal.SIGUSR1)
        rt = runtime.start(cfg)
        try:
            engine.train(cfg, rt, EventWriter("here", stream=buffer))
        finally:
            runtime.stop(rt)
    finally:
        checkpoint_request_take()
        signal.signal(signal.SIGUSR1, previous)
    return Result(0, [json.loads(line) for line in buffer.getvalue().splitlines()], "")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_NO_DOWNLOAD", "1")


@pytest.mark.usefixtures("offline")
@slow
def test_a_request_at_an_epochs_last_step_is_answered_by_the_epochs_checkpoint(
    sample_data: Path, tmp_path: Path
) -> None:
    result = _train_here(
        sample_data, "--dry-run", "--epochs", "2", "--checkpoint-dir", str(tmp_path), ask=True
    )
    answers = [
        (c["epoch"], c["requested"], c["answers_request"]) for c in result.of_type("checkpoint")
    ]
    assert answers == [(1, False, True), (2, False, False)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-1.pt", "epoch-2.pt"]


@pytest.mark.usefixtures("offline")
@slow
def test_resume_with_another_global_batch_says_what_is_trained_again(
    sample_data: Path, tmp_path: Path
) -> None:
    first = _train_here(
        sample_data, "--batch-size", "64", "--epochs", "2", "--steps-per-epoch", "4",
        "--checkpoint-dir", str(tmp_path), ask=True,
    )  # fmt: skip
    [asked] = [c for c in first.of_type("checkpoint") if c["requested"]]
    assert (asked["epoch"], asked["step"]) == (1, 1) and Path(asked["path"]).name == "step-1.pt"

    # 64 images trained; batches of 48: one batch skipped, 16 images trained again.
    again = _train_here(
        sample_data, "--batch-size", "48", "--epochs", "2", "--steps-per-epoch", "4",
        "--resume", asked["path"],
    )  # fmt: skip
    notes = again.started["notes"]
    assert any("16 of them are trained again" in n for n in notes), notes
    assert any("from its batch 2" in n for n in notes), notes
    # Three steps left in epoch 1 (2 to 4), four in epoch 2; a step event ends each epoch.
    assert [e["step"] for e in again.of_type("step")] == [4, 8] and again.finished["steps"] == 8

    # The epoch limited to 1 step: the checkpoint covers it, training goes on with epoch 2.
    short = _train_here(
        sample_data, "--batch-size", "64", "--epochs", "2", "--steps-per-epoch", "1",
        "--resume", asked["path"],
    )  # fmt: skip
    assert short.started["start_epoch"] == 2 and short.finished["steps"] == 2
