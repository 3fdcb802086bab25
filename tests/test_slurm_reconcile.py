"""The Slurm runs' reconciler and a job's claim where they meet another process on one run: the
job's supervisor, a round beside this one (beat rounds may overlap), a heartbeat that came
since the round read the run. In process, on the real database; the cluster's commands are
stand-ins (tests/slurm_fake.py: what each was asked is read back). The real cluster's answers:
tests/test_slurm.py."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from dashboard.experiments.core import transitions
from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.runs.slurm import job as job_module
from dashboard.experiments.runs.slurm.job import JobStart, slurm_attempt_claim
from dashboard.experiments.runs.slurm.reconcile import Reconciled, run_reconcile, slurm_reconcile
from dashboard.experiments.runs.slurm.submit import slurm_run_submit
from dashboard.experiments.scheduling.slurm.parse import SlurmJob, SlurmNode
from tests.slurm_fake import SlurmFake, slurm_backend_fake

pytestmark = pytest.mark.django_db

NODE = SlurmNode("n1", "127.0.0.1", 1, 0, "ALLOCATED", "vm")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> SlurmFake:
    return slurm_backend_fake(tmp_path, monkeypatch, settings)


def slurm_run(factory: Any, owner: Any, **fields: Any) -> Experiment:
    now = timezone.now()
    defaults = {"strategy": "ddp", "processes": 1, "backend": Backend.SLURM,
                "scheduler_job_id": "11", "heartbeat_at": now}  # fmt: skip
    return factory(owner=owner, **{**defaults, **fields})


def test_a_jobs_start_waits_while_the_reconciler_requeues_its_run(
    alice: Any, experiment_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scontrol requeue` (a preemption): the reconciler loses the running attempt, then queues
    the run (two updates), while the job's next start claims it. Between the two the run is
    lost; the claim gave up there, and the job ended without starting it: then its job was
    over, and the reconciler failed the queued run for it."""
    run = slurm_run(experiment_factory, alice, status=Status.LOST, attempt=1)
    requeued = []

    def sleep(seconds: float) -> None:  # the reconciler's second update, as the claim waits
        requeued.append(transitions.experiment_requeue(
            experiment_id=run.pk, waiting_reason="attempt 1 lost; queued", now=timezone.now()
        ))  # fmt: skip

    monkeypatch.setattr(job_module, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    start = JobStart(job_id="11", restarts=1, nodelist="n1")
    assert slurm_attempt_claim(experiment_id=run.pk, start=start, nodes=[NODE])
    run.refresh_from_db()
    assert requeued == [True]
    assert (run.status, run.attempt, run.scheduler_restarts) == (Status.RUNNING, 2, 1)
    # The same start again (a second supervisor of it) starts nothing: one attempt a start.
    assert not slurm_attempt_claim(experiment_id=run.pk, start=start, nodes=[NODE])
    assert Experiment.objects.get(pk=run.pk).attempt == 2


def test_a_jobs_end_ends_only_the_run_still_waiting_for_it(
    alice: Any, experiment_factory: Any, fake: SlurmFake
) -> None:
    """A round read the queued run in job 11; a round beside it found 11 gone, and submitted
    job 12. 11's end (cancelled, failed) is not the run's any more."""
    run = slurm_run(experiment_factory, alice)
    stale = Experiment.objects.get(pk=run.pk)
    Experiment.objects.filter(pk=run.pk).update(scheduler_job_id="12")
    for state in ("CANCELLED", "FAILED"):
        done = Reconciled()
        ended = SlurmJob("11", f"ty-{run.pk}", state, "")
        run_reconcile(run=stale, job=ended, now=timezone.now(), done=done)
        assert done == Reconciled()
        assert Experiment.objects.get(pk=run.pk).status == Status.QUEUED
    # Job 11 gone from the queue: the round beside this one sent 12 already; no third job.
    run_reconcile(run=stale, job=None, now=timezone.now(), done=Reconciled())
    assert fake.calls("sbatch") == []
    assert Experiment.objects.get(pk=run.pk).scheduler_job_id == "12"


def test_a_supervisor_that_beat_since_the_round_read_it_keeps_its_job(
    alice: Any, experiment_factory: Any, fake: SlurmFake, settings: Any
) -> None:
    """The round read an old heartbeat; the supervisor beat since. Its job was cancelled before
    the lose (which its heartbeat refused), and the run, cancelled from outside, ended."""
    fake.command("scancel")
    fake.command("sbatch", out="13\n")
    now = timezone.now()
    old = now - timedelta(seconds=settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS + 60)
    run = slurm_run(experiment_factory, alice, status=Status.RUNNING, attempt=1, heartbeat_at=old,
                    started_at=old, worker="n1")  # fmt: skip
    stale = Experiment.objects.get(pk=run.pk)
    Experiment.objects.filter(pk=run.pk).update(heartbeat_at=now)
    running = SlurmJob("11", f"ty-{run.pk}", "RUNNING", "")
    done = Reconciled()
    run_reconcile(run=stale, job=running, now=now, done=done)
    assert fake.calls() == [] and done == Reconciled()
    assert Experiment.objects.get(pk=run.pk).status == Status.RUNNING
    # Silent indeed: the attempt is lost, then its job cancelled, and the run goes on in a new one.
    Experiment.objects.filter(pk=run.pk).update(heartbeat_at=old)
    silent = Experiment.objects.get(pk=run.pk)
    run_reconcile(run=silent, job=running, now=now, done=done)
    assert done == Reconciled(lost=[run.pk], submitted=[run.pk])
    assert [c.split(" ", 1)[0] for c in fake.calls()] == ["scancel", "sbatch"]
    assert fake.calls("scancel") == ["scancel 11"]
    run.refresh_from_db()
    assert (run.status, run.scheduler_job_id) == (Status.QUEUED, "13")


def test_a_run_submitted_by_another_is_not_submitted_again(
    alice: Any, experiment_factory: Any, fake: SlurmFake
) -> None:
    fake.command("sbatch", out="14\n")
    run = slurm_run(experiment_factory, alice, scheduler_job_id="12")
    assert slurm_run_submit(experiment_id=run.pk, replacing="11") is None
    assert fake.calls() == []
    assert slurm_run_submit(experiment_id=run.pk, replacing="12") == "14"
    assert Experiment.objects.get(pk=run.pk).scheduler_job_id == "14"


def test_a_job_named_after_a_run_on_the_workers_is_not_a_stray(
    alice: Any, experiment_factory: Any, fake: SlurmFake
) -> None:
    """Run 7 trained on the workers and ended; a job ty-7 of this account (another checkout of
    Trainyard, a user's own) was never its job: the reconciler leaves it alone. A Slurm run's
    job left running a while after its run ended is cancelled."""
    long_ago = timezone.now() - timedelta(minutes=5)
    celery = experiment_factory(owner=alice, status=Status.SUCCEEDED, finished_at=long_ago)
    ended = slurm_run(experiment_factory, alice, status=Status.SUCCEEDED, finished_at=long_ago,
                      scheduler_job_id="31")  # fmt: skip
    fake.command("scancel")
    fake.command("squeue", out=f"30|ty-{celery.pk}|RUNNING|None\n31|ty-{ended.pk}|RUNNING|None\n")
    done = slurm_reconcile()
    assert done.jobs_cancelled == ["31"] and fake.calls("scancel") == ["scancel 31"]
