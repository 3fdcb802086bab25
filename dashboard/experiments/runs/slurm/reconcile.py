"""The Slurm runs' reconciler (Celery beat, every TRAINYARD_SLURM_RECONCILE_SECONDS): what the
scheduler did, mirrored on the runs by polling, as TorchX's and submitit's adapters read the
queue rather than being told.

One `squeue` a round for every `ty-*` job, then per active Slurm run, by its current job:
- pending: its state and Slurm's reason on the run ("Resources", "Priority", ...); a run still
  running in it was requeued (`scontrol requeue`, a preemption): that attempt is lost and the
  run queued, and the job's next start resumes it from its newest checkpoint;
- running: its state; a supervisor silent for the heartbeat bound (stuck, or cut off from the
  database) gets its job cancelled, and the run goes on in a new job as for a lost worker;
- ended from outside (an administrator's scancel, a failure): the run ends with the reason; a
  lost node (NODE_FAIL), a preemption or the time limit lose the attempt, and it resumes;
- gone from the queue: lost, and resumed in a new job.
A `ty-*` job alive whose run ended (or took another job) is cancelled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import ACTIVE_STATUSES, Backend, Experiment, Status
from dashboard.experiments.runs.lifecycle import run_cancel_queued, run_finish, run_refuse
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.slurm.publish import scheduler_body, scheduler_publish
from dashboard.experiments.runs.slurm.submit import slurm_job_cancel_quietly, slurm_run_submit
from dashboard.experiments.runs.survival import experiment_mark_lost
from dashboard.experiments.scheduling.slurm.jobs import job_run_id, slurm_jobs
from dashboard.experiments.scheduling.slurm.parse import SlurmJob
from dashboard.experiments.scheduling.slurm.texts import (
    cancelled_outside_text,
    pending_text,
    requeued_text,
    silent_text,
    vanished_text,
)

log = logging.getLogger(__name__)

# Ends of a job that lose the attempt rather than end the run: the machine or the scheduler
# failed it, not the training; it resumes from its newest checkpoint (TRAINYARD_MAX_ATTEMPTS).
LOSING_STATES = frozenset({"NODE_FAIL", "PREEMPTED", "TIMEOUT", "BOOT_FAIL"})
# How long a run that ended may leave its job running (its supervisor is exiting) before the
# reconciler cancels it.
ENDED_JOB_GRACE = timedelta(seconds=30)


@dataclass
class Reconciled:
    """What a round did, by run id (jobs: the stray jobs cancelled)."""

    ended: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    submitted: list[int] = field(default_factory=list)
    jobs_cancelled: list[str] = field(default_factory=list)


def slurm_reconcile(*, now: datetime | None = None) -> Reconciled:
    """One round over every active Slurm run and every ty-* job (module docstring)."""
    now = now or timezone.now()
    done = Reconciled()
    # The runs first: a job submitted after they are read is not taken for one that vanished.
    runs = list(Experiment.objects.filter(backend=Backend.SLURM, status__in=ACTIVE_STATUSES))
    jobs = slurm_jobs()  # SlurmError: no round (the beat task logs it)
    for run in runs:
        run_reconcile(run=run, job=jobs.get(run.scheduler_job_id), now=now, done=done)
    jobs_ended_mirror(jobs=[job for job in jobs.values() if job.ended])
    current = {run.scheduler_job_id for run in runs}
    for job in jobs.values():
        if not job.ended and job.job_id not in current and _stray(job, now=now):
            slurm_job_cancel_quietly(job_id=job.job_id)
            done.jobs_cancelled.append(job.job_id)
    return done


def jobs_ended_mirror(*, jobs: list[SlurmJob]) -> None:
    """The end of each job on its run, which ended first (its supervisor settled it): one query
    for all, then a write for each run whose state is not the job's end yet."""
    ends = {job.job_id: job.state for job in jobs}
    rows = Experiment.objects.filter(backend=Backend.SLURM, scheduler_job_id__in=list(ends))
    rows = rows.exclude(status__in=ACTIVE_STATUSES)
    for pk, job_id, state in rows.values_list("pk", "scheduler_job_id", "scheduler_state"):
        if state != ends[job_id]:
            # Only while the run is still this job's and not active (a lost run may be queued
            # again meanwhile, in a new job).
            written = (
                Experiment.objects.filter(pk=pk, scheduler_job_id=job_id)
                .exclude(status__in=ACTIVE_STATUSES)
                .update(scheduler_state=ends[job_id], scheduler_reason="")
            )
            if written:
                scheduler_publish(experiment_id=pk)


def _stray(job: SlurmJob, *, now: datetime) -> bool:
    """A live ty-* job that no active run holds: its run ended a while ago, or runs in another
    job (a job whose run is being submitted, or is settling, is not one yet)."""
    run_id = job_run_id(job.name)
    runs = Experiment.objects.filter(pk=run_id, backend=Backend.SLURM)
    run = runs.first() if run_id is not None else None
    if run is None:
        return False  # not a job of this installation's (a run on the workers had none)
    if run.status in ACTIVE_STATUSES:
        return bool(run.scheduler_job_id) and run.scheduler_job_id != job.job_id
    return run.finished_at is None or run.finished_at < now - ENDED_JOB_GRACE


def run_reconcile(
    *, run: Experiment, job: SlurmJob | None, now: datetime, done: Reconciled
) -> None:
    """One active run against its current job (the module docstring's cases)."""
    if not run.scheduler_job_id:
        # Never submitted (the web server stopped between the launch's commit and sbatch).
        bound = timedelta(seconds=settings.TRAINYARD_REDISPATCH_SECONDS)
        if run.status == Status.QUEUED and run.created_at < now - bound:
            _submit(run, done)
        return
    if job is None:
        why = vanished_text(job_id=run.scheduler_job_id)
        _lose(run, why=why, now=now, done=done, resubmit=True)
    elif job.pending:
        if run.status == Status.RUNNING:  # requeued under the attempt: the job starts it again
            why = requeued_text(job_id=job.job_id, attempt=run.attempt)
            _lose(run, why=why, now=now, done=done, resubmit=False)
        else:
            job_mirror(run=run, job=job)
    elif job.ended:
        _job_ended(run, job, now=now, done=done)
    else:
        job_mirror(run=run, job=job)
        _silence_check(run, job, now=now, done=done)


def job_mirror(*, run: Experiment, job: SlurmJob) -> None:
    """The job's state and reason on the run; a queued run's waiting reason says them, and its
    page hears once per change (the job's line; a queued run's status with its reason)."""
    if (run.scheduler_state, run.scheduler_reason) == (job.state, job.reason[:200]):
        return
    fields = {"scheduler_state": job.state, "scheduler_reason": job.reason[:200]}
    said = pending_text(job_id=job.job_id, state=job.state, reason=job.reason)
    if run.status == Status.QUEUED:
        fields["waiting_reason"] = said[:300]
    written = Experiment.objects.filter(
        pk=run.pk, status=run.status, scheduler_job_id=job.job_id
    ).update(**fields)
    if not written:
        return
    run.scheduler_state, run.scheduler_reason = job.state, job.reason[:200]
    sink = EventSink(run)
    if run.status == Status.QUEUED:
        sink.add({"type": "status", "status": Status.QUEUED, "reason": said})
    sink.add(scheduler_body(run))
    sink.flush()


def _job_ended(run: Experiment, job: SlurmJob, *, now: datetime, done: Reconciled) -> None:
    """The run's job ended and the run did not (its supervisor, killed or never started, could
    not settle it)."""
    why = cancelled_outside_text(job_id=job.job_id, state=job.state, reason=job.reason)
    if job.state in LOSING_STATES:
        _lose(run, why=why, now=now, done=done, resubmit=True)
        return
    if run.status == Status.QUEUED:
        # Only while it still waits for this job: a round beside this one (beat rounds may
        # overlap) may have lost it and submitted it again, and this job's end is not its end.
        where = {"scheduler_job_id": job.job_id}
        settled = (
            run_cancel_queued(experiment=run, by=None, error=why, now=now, where=where)
            if job.state == "CANCELLED"
            else run_refuse(experiment=run, error=why, where=where)
        )
    else:
        stopped = run.cancelled_by is not None and run.cancel_requested_at is not None
        status = Status.CANCELLED if job.state == "CANCELLED" or stopped else Status.FAILED
        error = f"Stopped by {run.cancelled_by}." if stopped else why
        outcome = Outcome(status, error=error)
        settled = run_finish(experiment=run, sink=EventSink(run), outcome=outcome)
    if settled:
        Experiment.objects.filter(pk=run.pk).update(scheduler_state=job.state)
        scheduler_publish(experiment_id=run.pk)
        done.ended.append(run.pk)


def _silence_check(run: Experiment, job: SlurmJob, *, now: datetime, done: Reconciled) -> None:
    """A running run whose supervisor went silent while its job runs: cancel the job, lose the
    attempt, resume in a new job."""
    bound = timedelta(seconds=settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS)
    if run.status != Status.RUNNING or run.heartbeat_at is None or run.heartbeat_at > now - bound:
        return
    silent = (now - run.heartbeat_at).total_seconds()
    # The job is cancelled once the attempt is lost, never before: a heartbeat that came since
    # this round read the run keeps it (the lose is conditional on the heartbeat it read), and a
    # job cancelled under a run that goes on would end it as cancelled from outside.
    _lose(run, why=silent_text(job_id=job.job_id, seconds=silent), now=now, done=done,
          resubmit=True, silent_job=job.job_id)  # fmt: skip


def _lose(
    run: Experiment, *, why: str, now: datetime, done: Reconciled, resubmit: bool,
    silent_job: str = "",
) -> None:  # fmt: skip
    """A running run's attempt lost (requeued while attempts remain); a queued run's job gone.
    `resubmit`: the run needs a new job (its own will not start it again). `silent_job`: the
    run's supervisor is silent in this job, which is cancelled once the attempt is lost (the
    lose holds only while the heartbeat is the one this round read); else the attempt is lost
    while it is the one this round read, whatever its heartbeat (the job ended it)."""
    if run.status == Status.RUNNING:
        own_silence = bool(silent_job)
        left_as = experiment_mark_lost(experiment=run, now=now, why=why, own_silence=own_silence)
        if left_as is None:
            return
        done.lost.append(run.pk)
        if silent_job:
            slurm_job_cancel_quietly(job_id=silent_job)
        if left_as != Status.QUEUED:
            return
    log.warning("slurm run %s: %s", run.pk, why)
    if resubmit:
        _submit(run, done)


def _submit(run: Experiment, done: Reconciled) -> None:
    if slurm_run_submit(experiment_id=run.pk, replacing=run.scheduler_job_id):
        done.submitted.append(run.pk)
