"""Every change of a run's status, and nothing else: read or add a transition here.

    queued ──start──▶ running ──finish──▶ succeeded | failed | cancelled
      │  │              │  │
      │  │ cancel_queued│  └──restart──▶ queued   (Stop and resume: from its last checkpoint)
      │  ▼              ▼ lose (the reaper: no heartbeat)
      │ cancelled      lost ──requeue──▶ queued   (attempts left: resumes from a checkpoint)
      │                 │
      │                 └───give_up───▶ failed   (attempts used up)
      └──refuse──▶ failed   (its Slurm job refused by sbatch: runs/slurm/)

Who moves a run: a worker's claim (runs/claim.py), or on Slurm its job's supervisor
(runs/slurm/job.py), starts it, its supervisor (runner.py)
finishes it (or, asked to stop and resume, restarts it), the reaper (survival.py) loses,
requeues and gives up on it, a Stop (services.py) cancels a queued one. A running run is
cancelled by its supervisor, which ends the training and finishes the run with the outcome
`cancelled`. Every change but the start goes through runs/lifecycle.py, which does the
transition here and tells the run's pages in one function (the start's page message waits for
the further nodes' tasks: runner.experiment_supervise).

Each transition is one conditional UPDATE: the row changes only while it is still in the status
the transition starts from (and, where it matters, on the same attempt or heartbeat), and the
function returns whether it did. False means another process got there first (a second worker
claimed the run, the reaper took a silent attempt away, a Stop cancelled a queued run): the
caller leaves the run alone. One UPDATE ... WHERE status = ... is atomic on every database, with
no lock held between a read and a write.

Other fields (heartbeats, the waiting reason, stop and checkpoint requests) are written where
they are asked for; they never move a run between statuses.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, F, Value, When

from dashboard.experiments.core.signals import run_ended
from dashboard.experiments.models import (
    PROFILE_IN_FLIGHT,
    Experiment,
    Profile,
    ProfileState,
    Status,
)

# The diagram above as data: from each status, the statuses a run may move to.
NEXT: dict[str, frozenset[str]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED}),
    Status.RUNNING: frozenset(
        {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.LOST, Status.QUEUED}
    ),
    Status.LOST: frozenset({Status.QUEUED, Status.FAILED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}
# The ends of an attempt its supervisor saw through.
FINISHED = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
# The ends of a run: nothing moves it on from these (lost is not one: it resumes or fails).
ENDS = frozenset(status for status, onwards in NEXT.items() if not onwards)
# What an attempt leaves behind when it ends, however it ends: no launcher to signal, no
# checkpoint request (one the training never got to has nothing left to answer it; a next
# attempt starts from the newest checkpoint), and no stall (ranks that ended wait for nothing:
# the page hides the banner at the end it is told of, with no message of its own).
ATTEMPT_ENDED: dict[str, Any] = {
    "launcher_pid": None,
    "checkpoint_requested_at": None,
    "checkpoint_requested_by": None,
    "stalled": None,
}


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, as its supervisor saw it: the final status and what goes with it."""

    status: str
    _: KW_ONLY
    error: str = ""
    test_loss: float | None = None
    test_accuracy: float | None = None
    # Ended by a Stop and resume: the run is queued again (experiment_restart), not finished.
    restart: bool = False


def _move(
    experiment_id: int,
    source: str,
    target: str,
    *,
    where: dict[str, Any] | None = None,
    **fields: Any,
) -> bool:
    if target not in NEXT[source]:
        raise ValueError(f"a run cannot go from {source} to {target}")
    moved = Experiment.objects.filter(pk=experiment_id, status=source, **(where or {})).update(
        status=target, **fields
    )
    if moved == 1 and source == Status.RUNNING:
        # An attempt's end ends its profile in flight: no training is left to record it.
        Profile.objects.filter(experiment_id=experiment_id, state__in=PROFILE_IN_FLIGHT).update(
            state=ProfileState.FAILED,
            message=f"the run stopped ({target}) before every rank had written its trace",
        )
    if moved == 1 and target in ENDS:
        # Every way a run ends passes here, so a receiver hears of each end exactly once. A
        # receiver that raises is skipped (send_robust logs it on django.dispatch): the run
        # settles regardless.
        run_ended.send_robust(sender=Experiment, experiment_id=experiment_id)
    return moved == 1


def experiment_start(
    *, experiment: Experiment, worker: str, now: datetime, placement: list[Any] | None = None
) -> bool:
    """queued -> running on `worker` (node 0 of `placement`, the machines it runs on): the claim
    of one attempt (counted here)."""
    fields = _start_fields(experiment=experiment, worker=worker, now=now, placement=placement)
    return _move(experiment.pk, Status.QUEUED, Status.RUNNING, **fields)


def experiment_start_job(
    *, experiment: Experiment, job_id: str, restarts: int, now: datetime, placement: list[Any]
) -> bool:
    """queued -> running in Slurm job `job_id`, the run's current job only (a job the run was
    taken from must not start it), at the job's `restarts`-th start: its supervisor's claim."""
    worker = str(placement[0]["worker"])
    fields = _start_fields(experiment=experiment, worker=worker, now=now, placement=placement)
    job = {"scheduler_state": "RUNNING", "scheduler_reason": "", "scheduler_restarts": restarts}
    where = {"scheduler_job_id": job_id}
    return _move(experiment.pk, Status.QUEUED, Status.RUNNING, where=where, **fields, **job)


def _start_fields(
    *, experiment: Experiment, worker: str, now: datetime, placement: list[Any] | None
) -> dict[str, Any]:
    return dict(
        started_at=experiment.started_at or now,
        worker=worker,
        placement=placement or [{"worker": worker, "address": "", "node_rank": 0, "ranks": []}],
        attempt=F("attempt") + 1,
        heartbeat_at=now,
        waiting_reason="",
        error="",
        # A new attempt's ranks (other processes, maybe other machines) are judged afresh: a
        # rank named before would otherwise stay named at the lower bar, unsaid.
        straggler_rank=None,
        straggler_text="",
    )


def experiment_refuse(
    *, experiment_id: int, error: str, now: datetime, where: dict[str, Any] | None = None
) -> bool:
    """queued -> failed, where the scheduler refused the run's job (sbatch's error), or the job
    ended before it started the run (`where`: its job's id still the row's): no attempt was
    started, and none will be."""
    fields: dict[str, Any] = {"error": error, "finished_at": now, "waiting_reason": ""}
    return _move(experiment_id, Status.QUEUED, Status.FAILED, where=where, **fields)


def experiment_finish(
    *,
    experiment: Experiment,
    outcome: Outcome,
    history: list[dict[str, Any]],
    finished_at: datetime,
) -> bool:
    """running -> succeeded / failed / cancelled, for the attempt that ran: its supervisor's
    word. A later attempt (the reaper gave this one up) is not touched."""
    if outcome.status not in FINISHED:
        raise ValueError(f"an attempt does not finish as {outcome.status}")
    # A Stop that came after the training finished stopped nothing.
    unstopped = {"cancel_requested_at": None, "cancelled_by": None}
    return _move(
        experiment.pk,
        Status.RUNNING,
        outcome.status,
        where={"attempt": experiment.attempt},
        attempts=history,
        finished_at=finished_at,
        error=outcome.error,
        **outcome_figures(outcome),
        resume_requested=False,  # a Stop and resume that came too late resumes nothing
        **ATTEMPT_ENDED,
        **(unstopped if outcome.status == Status.SUCCEEDED else {}),
    )


def outcome_figures(outcome: Outcome) -> dict[str, float]:
    """The test figures the end gives the row: the finished event's. An end without them (a
    Stop, a failure) keeps those of the last evaluation, which the sink wrote to the row."""
    figures = {"test_loss": outcome.test_loss, "test_accuracy": outcome.test_accuracy}
    return {key: value for key, value in figures.items() if value is not None}


def experiment_restart(
    *, experiment: Experiment, history: list[dict[str, Any]], waiting_reason: str, now: datetime
) -> bool:
    """running -> queued, for the attempt that ran: its supervisor ended it as asked (Stop and
    resume), and the next attempt resumes from the newest checkpoint (runs/attempts.py)."""
    fields: dict[str, Any] = {
        "attempts": history,
        "waiting_reason": waiting_reason[:300],
        "heartbeat_at": now,
        "cancel_requested_at": None,
        "cancelled_by": None,
        "resume_requested": False,
        **ATTEMPT_ENDED,
    }
    where = {"attempt": experiment.attempt}
    return _move(experiment.pk, Status.RUNNING, Status.QUEUED, where=where, **fields)


def experiment_lose(
    *, experiment: Experiment, reason: str, history: list[dict[str, Any]], node_silent: bool = False
) -> bool:
    """running -> lost, when the heartbeat the reaper read is still the last one; or, when one
    machine of a multi-node run fell silent (`node_silent`, the others still beat), while the
    attempt the reaper read is still the one running."""
    where: dict[str, Any] = (
        {"attempt": experiment.attempt}
        if node_silent
        else {"heartbeat_at": experiment.heartbeat_at}
    )
    fields: dict[str, Any] = {"error": reason, "attempts": history, **ATTEMPT_ENDED}
    return _move(experiment.pk, Status.RUNNING, Status.LOST, where=where, **fields)


def experiment_requeue(*, experiment_id: int, waiting_reason: str, now: datetime) -> bool:
    """lost -> queued, for another attempt; the caller sends it to a worker. A Stop and resume
    that was pending when the run was lost is this requeue itself: its Stop is cleared with it
    (in the same UPDATE), or the next attempt would be stopped at once only to start a third.
    A plain Stop pending is left as it was."""

    def unless_resuming(field: str) -> Case:
        return Case(When(resume_requested=True, then=Value(None)), default=F(field))

    fields: dict[str, Any] = {
        "waiting_reason": waiting_reason[:300],
        "heartbeat_at": now,
        "cancel_requested_at": unless_resuming("cancel_requested_at"),
        "cancelled_by": unless_resuming("cancelled_by"),
        "resume_requested": False,
    }
    return _move(experiment_id, Status.LOST, Status.QUEUED, **fields)


def experiment_give_up(*, experiment_id: int, error: str, now: datetime) -> bool:
    """lost -> failed, its attempts used up (a Stop and resume pending resumes nothing)."""
    fields: dict[str, Any] = {"error": error, "finished_at": now, "resume_requested": False}
    return _move(experiment_id, Status.LOST, Status.FAILED, **fields)


def experiment_cancel_queued(
    *, experiment_id: int, by: Any, error: str, now: datetime,
    where: dict[str, Any] | None = None,
) -> bool:  # fmt: skip
    """queued -> cancelled, by a Stop that came before any worker started the run (or, `where`
    its Slurm job is still the row's, that job cancelled from outside)."""
    fields: dict[str, Any] = {
        "cancel_requested_at": now,
        "cancelled_by": by,
        "finished_at": now,
        "error": error,
    }
    return _move(experiment_id, Status.QUEUED, Status.CANCELLED, where=where, **fields)
