"""Celery tasks: thin, they take ids and call the services.

Services import these tasks to queue them (`experiment_launch`); nothing the tasks call imports
them back. The reaper returns the runs it queued again and the task here sends them.

Queues: every worker consumes the shared one and its machine's own (dashboard/celery.py). A run
pinned to machines goes to its first machine's queue; once a multi-node run is claimed,
`run_experiment` sends node k >= 1 its `run_node` task on that node's machine queue.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.conf import settings

from dashboard.devices.facts import machine_name, machine_queue
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.claim import experiment_claim
from dashboard.experiments.runs.nodes import nodes_further
from dashboard.experiments.runs.runner import experiment_node_supervise, experiment_supervise
from dashboard.experiments.runs.survival import experiments_reap_lost, experiments_redispatch_queued
from dashboard.experiments.scheduling.allocation import machine_local

log = logging.getLogger(__name__)


@shared_task(bind=True, name="experiments.run_experiment", ignore_result=True, max_retries=None)
def run_experiment(self: Any, experiment_id: int, wake: bool = False) -> str | None:
    """Claim the run on this machine, then route it, retry it, or send its further nodes their
    tasks and supervise it here; returns the status it was settled in (None: not by this task)."""
    worker = machine_name()
    claim = experiment_claim(experiment_id=experiment_id, machine=machine_local(worker=worker))
    if claim.routed_to:
        # Another machine's worker must claim it (pinned there, or a multi-node run this
        # machine cannot host now): the message moves to that machine's queue, nudge or not.
        run_experiment.apply_async(
            (experiment_id,), {"wake": wake}, queue=machine_queue(claim.routed_to)
        )
        return None
    if claim.waiting_reason and wake:
        # A nudge sent when a device freed (queue_wake.py): the run's own message keeps retrying.
        return None
    if claim.waiting_reason:
        # Devices are busy: ask again shortly, on the queue the message came from.
        raise self.retry(countdown=settings.TRAINYARD_WAIT_RETRY_SECONDS)
    if not claim.claimed:
        log.info("experiment %s was not queued any more; not starting it", experiment_id)
        return None
    run_nodes_send(experiment_id=experiment_id)  # committed: each further node to its machine
    status = experiment_supervise(experiment_id=experiment_id, worker=worker)
    if status == Status.QUEUED:  # stopped to resume from its last checkpoint: the next attempt
        run_experiment_send(experiment=Experiment.objects.get(pk=experiment_id))
    return status


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
    return {"lost": reaped.lost, "requeued": reaped.requeued, "redispatched": redispatched}
