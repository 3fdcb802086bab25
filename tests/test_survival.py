"""Allocation, the reaper, resume and orphans, as plain functions over the database (and the
beat task that sends what the reaper queued)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.utils import timezone

from dashboard.experiments.models import Checkpoint, Experiment, SeriesPoint
from dashboard.experiments.runs.attempts import experiment_resume_prepare
from dashboard.experiments.runs.claim import experiment_claim
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.survival import Reaped, experiments_reap_lost, training_orphans_end
from dashboard.experiments.scheduling.allocation import Machine, allocation_refusal
from dashboard.experiments.tasks import reap_lost_runs

pytestmark = pytest.mark.django_db

GPU_NODE = Machine("gpu-node-1", cpu_count=16, gpu_ids=frozenset({0, 1, 2, 3}))
CPU_NODE = Machine("cpu-node", cpu_count=2, gpu_ids=frozenset())


@pytest.fixture
def alice(user_factory: Any) -> Any:
    return user_factory(username="alice")


def test_gpus_are_never_shared(alice: Any, experiment_factory: Any) -> None:
    running = experiment_factory(owner=alice, gpus=[0, 1], status="running", worker=GPU_NODE.name)
    wanted = experiment_factory(owner=alice, gpus=[1, 2])
    reason = allocation_refusal(experiment=wanted, machine=GPU_NODE, busy=[running])
    assert reason == f"waiting for 2 GPUs on gpu-node-1: GPU 1 in use by #{running.pk}"
    free = experiment_factory(owner=alice, gpus=[2, 3])
    assert allocation_refusal(experiment=free, machine=GPU_NODE, busy=[running]) is None


def test_gpus_the_machine_lacks(alice: Any, experiment_factory: Any) -> None:
    wanted = experiment_factory(owner=alice, gpus=[0])
    reason = allocation_refusal(experiment=wanted, machine=CPU_NODE, busy=[])
    assert reason == "waiting for GPUs 0: cpu-node has GPUs none"


def test_cpu_threads_never_exceed_cores(alice: Any, experiment_factory: Any) -> None:
    ddp = experiment_factory(owner=alice, strategy="ddp", processes=2, status="running")
    single = experiment_factory(owner=alice, strategy="single", processes=1)
    reason = allocation_refusal(experiment=single, machine=CPU_NODE, busy=[ddp])
    assert reason == f"waiting for 2 CPU cores on cpu-node: 2 of 2 in use by #{ddp.pk}"
    assert allocation_refusal(experiment=single, machine=CPU_NODE, busy=[]) is None


def test_two_claims_of_one_run_one_wins(alice: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=alice, strategy="ddp", processes=2)
    first = experiment_claim(experiment_id=run.pk, machine=CPU_NODE)
    second = experiment_claim(experiment_id=run.pk, machine=CPU_NODE)
    assert first.claimed and not second.claimed and not second.waiting_reason
    run.refresh_from_db()
    assert run.status == "running" and run.attempt == 1 and run.worker == "cpu-node"


def test_a_busy_machine_leaves_the_run_queued_with_a_reason(
    alice: Any, experiment_factory: Any
) -> None:
    experiment_factory(owner=alice, status="running", worker="cpu-node", processes=2)
    waiting = experiment_factory(owner=alice, strategy="ddp", processes=2)
    claim = experiment_claim(experiment_id=waiting.pk, machine=CPU_NODE)
    waiting.refresh_from_db()
    assert not claim.claimed and waiting.status == "queued"
    assert waiting.waiting_reason.startswith("waiting for 2 CPU cores on cpu-node")


def _stale(experiment: Experiment, seconds: float) -> None:
    Experiment.objects.filter(pk=experiment.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_silent_run_is_lost_then_queued_again(
    alice: Any, experiment_factory: Any, launched: list[int], settings: Any
) -> None:
    settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS = 30
    run = experiment_factory(
        owner=alice, status="running", attempt=1, worker="w1",
        checkpoint_requested_at=timezone.now(),  # asked of the attempt that goes silent
    )  # fmt: skip
    fresh = experiment_factory(owner=alice, status="running", attempt=1, worker="w1")
    _stale(run, 31)
    _stale(fresh, 5)
    assert reap_lost_runs() == {
        "lost": [run.pk],
        "requeued": [run.pk],
        "redispatched": [],
        "woken": [],
    }
    run.refresh_from_db()
    assert run.status == "queued" and launched == [run.pk]
    assert run.checkpoint_requested_at is None
    assert run.attempts[0]["outcome"] == "lost" and "no heartbeat from worker w1" in run.error
    assert "queued to resume" in run.waiting_reason


def test_the_reaper_returns_what_it_queued_and_sends_nothing(
    alice: Any, experiment_factory: Any, launched: list[int], settings: Any
) -> None:
    settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS = 30
    run = experiment_factory(owner=alice, status="running", attempt=1, worker="w1")
    _stale(run, 31)
    assert experiments_reap_lost() == Reaped(lost=[run.pk], requeued=[run.pk])
    assert not launched  # the beat task sends it


def test_a_run_lost_too_often_fails_with_its_history(
    alice: Any, experiment_factory: Any, launched: list[int], settings: Any
) -> None:
    settings.TRAINYARD_MAX_ATTEMPTS = 2
    history = [{"attempt": 1, "worker": "w1", "outcome": "lost", "reason": "no heartbeat"}]
    run = experiment_factory(owner=alice, status="running", attempt=2, attempts=history)
    _stale(run, 3600)
    assert reap_lost_runs() == {"lost": [run.pk], "requeued": [], "redispatched": [], "woken": []}
    run.refresh_from_db()
    assert run.status == "failed" and not launched
    assert run.error.startswith("gave up after 2 attempts") and "attempt 1 on w1" in run.error


def _checkpoint(run: Any, folder: Path, name: str, epoch: int, step: int) -> Path:
    path = folder / name
    path.write_bytes(b"x")
    Checkpoint.objects.create(experiment=run, epoch=epoch, step=step, path=str(path))
    return path


def test_resume_replaces_the_points_after_the_checkpoint(
    alice: Any, experiment_factory: Any, settings: Any, tmp_path: Path
) -> None:
    settings.TRAINYARD_RUNS_DIR = tmp_path
    run = experiment_factory(owner=alice, status="running", attempt=2)
    folder = tmp_path / str(run.pk) / "checkpoints"
    folder.mkdir(parents=True)
    for epoch in (1, 2):
        _checkpoint(run, folder, f"epoch-{epoch}.pt", epoch, epoch * 20)
    # Two points an epoch: a step point, and the epoch's point at its last step.
    for seq, (epoch, step) in enumerate([(1, 10), (1, 20), (2, 30), (2, 40), (3, 50)], start=1):
        SeriesPoint.objects.create(experiment=run, key=f"e{epoch}", step=step, time=seq, value=1)
    run.step = 50
    run.save(update_fields=["step"])
    assert experiment_resume_prepare(experiment=run) == folder / "epoch-2.pt"
    assert sorted(run.series.values_list("step", flat=True)) == [10, 20, 30, 40]
    # A machine sample taken before the resumed training reports a step sits at the checkpoint.
    run.refresh_from_db()
    assert run.step == 40
    sink = EventSink(run)
    sink.add_series({"machine/cpu_percent": 12.0}, time_=60.0)
    sink.flush()
    assert run.series.get(key="machine/cpu_percent").step == 40


def test_resume_takes_the_newest_checkpoint_even_a_requested_one(
    alice: Any, experiment_factory: Any, settings: Any, tmp_path: Path
) -> None:
    settings.TRAINYARD_RUNS_DIR = tmp_path
    run = experiment_factory(owner=alice, status="running", attempt=2)
    folder = tmp_path / str(run.pk) / "checkpoints"
    folder.mkdir(parents=True)
    _checkpoint(run, folder, "epoch-1.pt", 1, 20)
    asked = _checkpoint(run, folder, "step-35.pt", 2, 35)
    # Reported but gone from this machine: not a starting point.
    Checkpoint.objects.create(experiment=run, epoch=2, step=38, path=str(folder / "gone.pt"))
    for seq, (epoch, step) in enumerate([(1, 20), (2, 30), (2, 36), (2, 40)], start=1):
        SeriesPoint.objects.create(experiment=run, key=f"e{epoch}", step=step, time=seq, value=1)
    assert experiment_resume_prepare(experiment=run) == asked
    # Epoch 2's own point (step 40) came after the checkpoint: replayed, so removed.
    assert sorted(run.series.values_list("step", flat=True)) == [20, 30]


def test_resume_without_checkpoint_starts_over(
    alice: Any, experiment_factory: Any, settings: Any, tmp_path: Path
) -> None:
    settings.TRAINYARD_RUNS_DIR = tmp_path
    run = experiment_factory(owner=alice, status="running", attempt=2)
    SeriesPoint.objects.create(experiment=run, key="train_loss", step=10, time=1, value=1)
    assert experiment_resume_prepare(experiment=run) is None
    assert not run.series.exists()
    run.refresh_from_db()
    assert run.step == 0


def test_queued_runs_are_sent_again_when_their_message_may_be_lost(
    alice: Any, experiment_factory: Any, launched: list[int], settings: Any
) -> None:
    settings.TRAINYARD_REDISPATCH_SECONDS = 60
    old = experiment_factory(owner=alice)
    Experiment.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    experiment_factory(owner=alice)  # just created: its message is on its way
    assert reap_lost_runs()["redispatched"] == [old.pk] and launched == [old.pk]
    assert reap_lost_runs()["redispatched"] == []  # and not again at once
    assert launched == [old.pk]


@pytest.mark.django_db(transaction=False)
def test_orphaned_training_processes_are_ended() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # noqa: S603
    dead.wait()
    env = {**os.environ, "TRAINYARD_SUPERVISOR_PID": str(dead.pid), "TRAINYARD_RUN_ID": "9"}
    orphan = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env
    )
    me = psutil.Process()
    alive_env = {
        **os.environ,
        "TRAINYARD_SUPERVISOR_PID": str(me.pid),
        "TRAINYARD_SUPERVISOR_STARTED": repr(me.create_time()),
    }
    supervised = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", "import time; time.sleep(60)"], env=alive_env
    )
    try:
        time.sleep(0.3)
        ended = training_orphans_end()
        assert orphan.pid in ended and supervised.pid not in ended
        assert orphan.wait(timeout=5) is not None
        assert supervised.poll() is None
    finally:
        for process in (orphan, supervised):
            process.kill()
            process.wait()
