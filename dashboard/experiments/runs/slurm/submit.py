"""A queued Slurm run's job: submitted once the launch has committed (services.py) or when a lost
run goes on (reconcile.py), and cancelled with a run stopped before it started."""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.runs.lifecycle import run_refuse
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.slurm.publish import scheduler_body
from dashboard.experiments.scheduling.slurm.commands import SlurmError
from dashboard.experiments.scheduling.slurm.jobs import (
    JobRequest,
    slurm_job_cancel,
    slurm_job_renice,
    slurm_job_submit,
)
from dashboard.experiments.scheduling.slurm.texts import refused_text, submitted_text

log = logging.getLogger(__name__)


def job_request(*, experiment: Experiment) -> JobRequest:
    return JobRequest(
        experiment_id=experiment.pk,
        nodes=max(1, experiment.nodes),
        ranks_per_node=max(1, experiment.processes),
        gpus_per_node=len(experiment.gpus),
        partition=experiment.partition,
        time_limit_minutes=experiment.time_limit_minutes,
        priority=experiment.priority,
        # Beside the run's checkpoints (the shared runs folder): what the job's supervisor logs.
        log=Path(settings.TRAINYARD_RUNS_DIR) / str(experiment.pk) / "slurm-%j.out",
    )


def slurm_run_submit(*, experiment_id: int, replacing: str | None = None) -> str | None:
    """sbatch the queued run's job and write its id on the run; a job sbatch refuses fails the
    run with sbatch's words. Returns the job's id (None: not queued, or refused). `replacing`:
    the job the caller saw the run hold (the reconciler's: gone, or ended); where the run holds
    another by now, someone else submitted it, and no second job is sent."""
    run = Experiment.objects.filter(
        pk=experiment_id, status=Status.QUEUED, backend=Backend.SLURM
    ).first()
    if run is None or (replacing is not None and run.scheduler_job_id != replacing):
        return None
    # Each write below only while the run still holds the job it held here: two submitters
    # (a launch and a reconciler round, two rounds) leave one job on it, and cancel the other.
    held = {"scheduler_job_id": run.scheduler_job_id}
    try:
        job_id = slurm_job_submit(job_request(experiment=run))
    except SlurmError as exc:
        run_refuse(experiment=run, error=refused_text(error=str(exc)), where=held)
        return None
    said = submitted_text(job_id=job_id)
    written = Experiment.objects.filter(pk=run.pk, status=Status.QUEUED, **held).update(
        scheduler_job_id=job_id, scheduler_state="PENDING", scheduler_reason="",
        waiting_reason=said, heartbeat_at=timezone.now(),
    )  # fmt: skip
    if not written:  # stopped, or submitted by another, meanwhile: nothing wants this job
        slurm_job_cancel_quietly(job_id=job_id)
        return None
    run.scheduler_job_id, run.scheduler_state, run.scheduler_reason = job_id, "PENDING", ""
    # A priority changed while sbatch ran found no job to renice (or the one this replaces):
    # this job asked with the priority read before, so it takes the row's now.
    if Experiment.objects.filter(pk=run.pk).exclude(priority=run.priority).exists():
        slurm_run_reprioritised(experiment_id=run.pk)
    sink = EventSink(run)
    sink.add({"type": "status", "status": Status.QUEUED, "reason": said})
    sink.add(scheduler_body(run))  # the page's job line: "not submitted yet" until now
    sink.flush()
    return job_id


def slurm_job_cancel_quietly(*, job_id: str) -> None:
    """scancel, where a failure must not stop the caller (the reconciler cancels what is left
    of a run that ended)."""
    try:
        slurm_job_cancel(job_id)
    except SlurmError as exc:
        log.warning("job %s could not be cancelled: %s", job_id, exc)


def slurm_run_stopped(*, experiment: Experiment) -> None:
    """A Slurm run stopped while queued: its job, pending or just starting, goes too (its id as
    the row holds it now: the caller's copy may be older than the submission)."""
    if experiment.backend != Backend.SLURM:
        return
    job_id = Experiment.objects.filter(pk=experiment.pk).values_list("scheduler_job_id", flat=True)
    if job_id and job_id[0]:
        slurm_job_cancel_quietly(job_id=job_id[0])


def slurm_run_reprioritised(*, experiment_id: int) -> None:
    """A queued Slurm run's priority changed (the queue's staff control, the admin): its pending
    job's nice follows (a job already started keeps its place; a failure is logged, the run's
    next job takes the new priority)."""
    held = Experiment.objects.filter(
        pk=experiment_id, status=Status.QUEUED, backend=Backend.SLURM
    ).exclude(scheduler_job_id="")
    row = held.values_list("scheduler_job_id", "priority").first()
    if row is None:
        return
    try:
        slurm_job_renice(row[0], priority=row[1])
    except SlurmError as exc:
        log.warning("job %s could not take its run's priority: %s", row[0], exc)
