"""A Slurm run's job as its page shows it, and the `scheduler` message that tells an open page
when it changes (core/messages.py): the job's submission, its start, and what the reconciler
mirrors from squeue (a pending reason, a requeue, the job's end). The read JSON and the
snapshot take the same fact from here, so a reload and the live page agree."""

from __future__ import annotations

from dashboard.experiments.core.messages import SchedulerBody
from dashboard.experiments.models import Backend, Experiment
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.scheduling.slurm.texts import job_text


def job_fact(experiment: Experiment) -> dict[str, str] | None:
    """The read JSON's `scheduler`: the run's job, its state and reason; None off Slurm."""
    if experiment.backend != Backend.SLURM:
        return None
    return {
        "job_id": experiment.scheduler_job_id,
        "state": experiment.scheduler_state,
        "reason": experiment.scheduler_reason,
    }


def job_fact_text(experiment: Experiment) -> str:
    """The page's line for the run's job ("" off Slurm)."""
    if experiment.backend != Backend.SLURM:
        return ""
    return job_text(
        job_id=experiment.scheduler_job_id, state=experiment.scheduler_state,
        reason=experiment.scheduler_reason, partition=experiment.partition,
        time_limit_minutes=experiment.time_limit_minutes,
    )  # fmt: skip


def scheduler_body(experiment: Experiment) -> SchedulerBody:
    """The `scheduler` message of the run's job as `experiment` holds it."""
    return {
        "type": "scheduler",
        "scheduler": job_fact(experiment) or {},
        "text": job_fact_text(experiment),
    }


def scheduler_publish(*, experiment_id: int) -> None:
    """Tell the run's page its job as the row holds it now (read afresh: the caller's update
    wrote it), numbered and sent as the run's other messages are."""
    run = Experiment.objects.filter(pk=experiment_id, backend=Backend.SLURM).first()
    if run is None:
        return
    sink = EventSink(run)
    sink.add(scheduler_body(run))
    sink.flush()
