"""Inside a run's Slurm job: claim the run's next attempt, supervise it with the same code a
Celery worker runs (runner.experiment_supervise, over step.SlurmStep), and requeue the job where
the attempt stopped to resume.

The batch script (scheduling/slurm/jobs.py) execs `manage.py slurm_job <id>`, so this process is
the batch shell and gets sbatch's `B:` signals. It runs on the allocation's first node and needs
what a worker needs: the database, Redis (the pages' live channel) and the shared runs folder.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from django.utils import timezone

from dashboard.experiments.core.transitions import experiment_start_job
from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.runs.runner import experiment_supervise
from dashboard.experiments.runs.slurm.publish import scheduler_publish
from dashboard.experiments.runs.slurm.step import SlurmStep
from dashboard.experiments.runs.survival import experiment_mark_lost
from dashboard.experiments.scheduling.slurm.commands import SlurmError
from dashboard.experiments.scheduling.slurm.jobs import (
    slurm_job_requeue,
    slurm_nodes,
    warning_seconds,
)
from dashboard.experiments.scheduling.slurm.parse import SlurmNode
from dashboard.experiments.scheduling.slurm.texts import requeued_text

log = logging.getLogger(__name__)

# A job may start before the web server has written its id on the run (sbatch answers, then the
# row is updated): its claim waits this long for it.
CLAIM_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class JobStart:
    """This start of the job, from the environment Slurm gives the batch script."""

    job_id: str
    restarts: int  # SLURM_RESTART_COUNT: 0 the first time, then 1, 2 ... after each requeue
    nodelist: str


def job_start_read(environ: Mapping[str, str]) -> JobStart:
    return JobStart(
        job_id=environ["SLURM_JOB_ID"],
        restarts=int(environ.get("SLURM_RESTART_COUNT") or 0),
        nodelist=environ["SLURM_JOB_NODELIST"],
    )


def slurm_job_run(
    *, experiment_id: int, environ: Mapping[str, str] = os.environ,
    moved: Callable[[], None] = lambda: None,
) -> str | None:  # fmt: skip
    """The job's whole life: claim, supervise, requeue where asked. Returns the status the run
    was left in by this job (None: it was not this job's to run, or Slurm ended it). `moved`:
    called where the run started, and where it stopped to resume (its owner's running count
    moved: the workers' queue is woken, tasks.slurm_job_supervise)."""
    start = job_start_read(environ)
    limits = Experiment.objects.filter(pk=experiment_id).values_list("time_limit_minutes")
    limit = limits.first()
    warning = warning_seconds(time_limit_minutes=limit[0] if limit else None)  # as sbatch's
    step = SlurmStep(job_id=start.job_id, warning_seconds=warning)
    # First: sbatch's warning may come at once (a preemption), and the claim may wait.
    step.signals_install()
    step.nodes = nodes = slurm_nodes(start.nodelist, here=True)
    if not slurm_attempt_claim(experiment_id=experiment_id, start=start, nodes=nodes):
        log.warning("run %s is not job %s's to start; leaving", experiment_id, start.job_id)
        return None
    moved()
    status = experiment_supervise(experiment_id=experiment_id, worker=nodes[0].name, executor=step)
    if status == Status.QUEUED:  # stopped to resume (sbatch's warning): this job again, later
        moved()
        try:
            slurm_job_requeue(start.job_id)
        except SlurmError as exc:
            log.error("run %s: the job could not requeue itself: %s", experiment_id, exc)
    return status


def slurm_attempt_claim(*, experiment_id: int, start: JobStart, nodes: list[SlurmNode]) -> bool:
    """Start the run's next attempt in this job: only the run's current job may, and only once
    per start of it. A run still running in an earlier start of this job (requeued by Slurm
    before the reconciler saw it) is lost first and queued, as for a silent worker."""
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    while True:
        run = Experiment.objects.filter(pk=experiment_id, backend=Backend.SLURM).first()
        if run is None:
            return False
        mine = run.scheduler_job_id == start.job_id
        if run.status == Status.RUNNING and mine and run.scheduler_restarts < start.restarts:
            why = requeued_text(job_id=start.job_id, attempt=run.attempt)
            experiment_mark_lost(experiment=run, now=timezone.now(), why=why)
            continue
        # Lost: the reconciler is queuing it again this moment (lost, then queued: two updates),
        # or gives it up; either way it is settled within the wait.
        if run.status not in (Status.QUEUED, Status.LOST):
            return False
        if mine and run.status == Status.QUEUED:
            placement = [
                {"worker": node.name, "address": node.address, "node_rank": rank, "ranks": []}
                for rank, node in enumerate(nodes)
            ]
            started = experiment_start_job(
                experiment=run, job_id=start.job_id, restarts=start.restarts,
                now=timezone.now(), placement=placement,
            )  # fmt: skip
            if started:  # the page's job line: running (the reconciler sees no change to say)
                scheduler_publish(experiment_id=experiment_id)
            return started
        if time.monotonic() > deadline:  # not this job's: the run's job is another
            return False
        time.sleep(0.5)
