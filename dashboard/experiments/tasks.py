"""Celery tasks: thin, they take ids and call the services.

Services import these tasks to queue them (`experiment_launch`); nothing the tasks call imports
them back. The reaper returns the runs it queued again and the task here sends them. A run that
waits has no task: it is woken (queue_wake_send, runs/parked.py).

Queues: every worker consumes the shared one and its machine's own (dashboard/celery.py). A run
pinned to machines goes to its first machine's queue; once a multi-node run is claimed,
`run_experiment` sends node k >= 1 its `run_node` task on that node's machine queue.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboard.devices.facts import machine_name, machine_queue
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.claim import experiment_claim
from dashboard.experiments.runs.nodes import nodes_further
from dashboard.experiments.runs.parked import Wake, queue_wake_plan
from dashboard.experiments.runs.runner import experiment_node_supervise, experiment_supervise
from dashboard.experiments.runs.slurm.job import slurm_job_run
from dashboard.experiments.runs.slurm.reconcile import slurm_reconcile
from dashboard.experiments.runs.survival import experiments_reap_lost, experiments_redispatch_queued
from dashboard.experiments.scheduling.allocation import machine_local
from dashboard.experiments.scheduling.queue import hostnames_online
from dashboard.experiments.scheduling.slurm.commands import SlurmError

log = logging.getLogger(__name__)


@shared_task(name="experiments.run_experiment", ignore_result=True)
def run_experiment(experiment_id: int, wake: bool = False) -> str | None:
    """Claim the run on this machine, then route it, park it, or send its further nodes their
    tasks and supervise it here; returns the status it was settled in (None: not by this task).

    A run that waits is parked (runs/parked.py): this task ends and nothing retries it; it is
    woken when room frees. `wake`: this message is a wake-up (queue_wake_send) or was routed
    here, so it looks for room on this machine only; a run's first message (its launch, its
    requeue) is sent on to another machine with room (claim.experiment_claim's `elsewhere`)."""
    worker = machine_name()
    claim = experiment_claim(
        experiment_id=experiment_id, machine=machine_local(worker=worker), elsewhere=not wake
    )
    if claim.routed_to:
        # Another machine's worker must claim it (pinned there, a multi-node run this machine
        # cannot host now, or one with room): the message moves to that machine's queue.
        run_experiment.apply_async(
            (experiment_id,), {"wake": True}, queue=machine_queue(claim.routed_to)
        )
        return None
    if claim.waiting_reason:
        if not wake:
            # Its first claim, held up here: where it is its turn on another machine with room,
            # nothing may end to wake it, so it is woken there. (A run that just came may stand
            # before others: the reaper's beat says where they stand now, runs/parked.py.)
            queue_wake_quietly(workers=hostnames_online() - {worker}, runs=[experiment_id])
        return None
    if not claim.claimed:
        if wake:  # another worker took it, or it was cancelled: the next in turn here
            queue_wake_quietly(workers=[worker])
        log.info("experiment %s was not queued any more; not starting it", experiment_id)
        return None
    run_nodes_send(experiment_id=experiment_id)  # committed: each further node to its machine
    # Everywhere: it no longer stands before the runs it held up on the machines it did not
    # take, and where room is left here, the next in turn takes it.
    queue_wake_quietly(workers=None)
    status = experiment_supervise(experiment_id=experiment_id, worker=worker)
    if status == Status.QUEUED:  # stopped to resume from its last checkpoint: the next attempt
        run_experiment_send(experiment=Experiment.objects.get(pk=experiment_id))
        queue_wake_quietly(workers=None)  # its devices are free, and its owner's share moved
    return status


def queue_wake_quietly(
    *, workers: Collection[str] | None, runs: Collection[int] | None = None
) -> None:
    """queue_wake_send, where a failure must not stop the run this task holds: the reaper's net
    wakes whose turn it is later."""
    try:
        queue_wake_send(workers=workers, runs=runs)
    except Exception:
        log.exception("the queue could not be woken on %s", workers or "every machine")


def queue_wake_send(
    *,
    workers: Collection[str] | None = None,
    due_before: datetime | None = None,
    runs: Collection[int] | None = None,
    reasons: bool = False,
) -> list[Wake]:
    """Wake the runs whose turn it is on `workers` (every machine online: None), each on its
    machine's queue (runs/parked.py says who calls this, and when; `due_before`: the net's;
    `runs`: only these; `reasons`: the others' reasons written too, the beat's)."""
    wakes = queue_wake_plan(workers=workers, due_before=due_before, runs=runs, reasons=reasons)
    for wake in wakes:
        run_experiment.apply_async(
            (wake.experiment_id,), {"wake": True}, queue=machine_queue(wake.worker)
        )
    return wakes


# The wakes asked for while held (queue_wakes_held), which go as one pass when the hold ends.
_wakes_held: ContextVar[list[bool] | None] = ContextVar("queue_wakes_held", default=None)


def queue_wake_on_commit() -> None:
    """Wake whose turn it is once the caller's transaction commits (a run ended, a priority
    moved), or once for all, where the caller holds the wakes (queue_wakes_held). Robust: a
    failure is logged and never reaches the caller."""
    held = _wakes_held.get()
    if held is not None:
        held.append(True)
        return
    transaction.on_commit(queue_wake_send, robust=True)


@contextmanager
def queue_wakes_held() -> Iterator[None]:
    """Runs ended together (a study stopped, the admin's selection): one pass over the queue at
    the end, not one a run. Each pass reads the whole queue and rewrites the reasons that moved;
    one a run made stopping a study of 48 queued runs take half a minute."""
    held: list[bool] = []
    token = _wakes_held.set(held)
    try:
        yield
    finally:
        _wakes_held.reset(token)
        if held:
            transaction.on_commit(queue_wake_send, robust=True)


def run_nodes_send(*, experiment_id: int) -> None:
    """Send each further node of a just-claimed run its task, on its machine's queue."""
    for node in nodes_further(experiment_id=experiment_id):
        run_node.apply_async(
            kwargs={"experiment_id": node.experiment_id, "attempt": node.attempt,
                    "node_rank": node.node_rank},
            queue=machine_queue(node.machine),
        )  # fmt: skip


def run_experiment_send(*, experiment: Experiment) -> None:
    """Queue a run: a pinned one on its first machine's queue, any other on the shared one."""
    if experiment.machines:
        queue = machine_queue(str(experiment.machines[0]))
        run_experiment.apply_async((experiment.pk,), queue=queue)
    else:
        run_experiment.delay(experiment.pk)


@shared_task(name="experiments.run_node", ignore_result=True)
def run_node(experiment_id: int, attempt: int, node_rank: int) -> str | None:
    """Node `node_rank` (1 and up) of a multi-node run's attempt, on this machine (the claim
    sent it to this machine's queue once node 0 had claimed the run)."""
    return experiment_node_supervise(
        experiment_id=experiment_id, attempt=attempt, node_rank=node_rank, worker=machine_name()
    )


@shared_task(name="experiments.reap_lost_runs", ignore_result=True)
def reap_lost_runs() -> dict[str, list[int]]:
    reaped = experiments_reap_lost()
    redispatched = experiments_redispatch_queued()
    # Committed already (a task runs in autocommit): a worker that takes one finds it queued.
    for experiment in Experiment.objects.filter(pk__in=[*reaped.requeued, *redispatched]):
        run_experiment_send(experiment=experiment)
    # The waiting runs' reasons are written here, where their places moved (runs/parked.py).
    if reaped.requeued:  # their devices are free, and their owners' shares moved
        woken = queue_wake_send(reasons=True)
    else:  # the net under the wake-ups (runs/parked.py): whose turn it is, not tried lately
        due = timezone.now() - timedelta(seconds=settings.TRAINYARD_REDISPATCH_SECONDS)
        woken = queue_wake_send(due_before=due, reasons=True)
    return {
        "lost": reaped.lost,
        "requeued": reaped.requeued,
        "redispatched": redispatched,
        "woken": [wake.experiment_id for wake in woken],
    }


@shared_task(name="experiments.slurm_reconcile", ignore_result=True)
def slurm_reconcile_runs() -> dict[str, list[Any]]:
    """The Slurm jobs' states on their runs (runs/slurm/reconcile.py; beat, where TRAINYARD_SLURM
    is on); a cluster that cannot be asked is tried again next round."""
    try:
        done = slurm_reconcile()
    except SlurmError as exc:
        log.warning("the Slurm jobs could not be read: %s", exc)
        return {}
    if done.lost:  # their owners' running counts moved: whose turn it is on the workers too
        queue_wake_quietly(workers=None)
    return asdict(done)


def slurm_job_supervise(*, experiment_id: int) -> str | None:
    """A Slurm run's job (manage.py slurm_job, which its batch script execs): its supervisor, as
    run_experiment is a worker's. Its owner's running count, which the workers' queue counts
    (a user's running limit, the turns between users), moves where it starts and where it stops
    to resume: the queue is woken then, as a worker's claim wakes it (its end wakes it through
    run_ended)."""
    return slurm_job_run(
        experiment_id=experiment_id, moved=lambda: queue_wake_quietly(workers=None)
    )
