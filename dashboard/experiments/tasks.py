"""Celery tasks: thin, they take ids and call the services.

Services import these tasks to queue them (`experiment_launch`); nothing the tasks call imports
them back. The reaper returns the runs it queued again and the task here sends them.

Queues: every worker consumes the shared one and its machine's own (dashboard/celery.py). A run
pinned to machines goes to its first machine's queue; a multi-node run's claim (runner.py)
sends node k >= 1 its `run_node` task on that node's machine queue.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from dashboard.devices.facts import machine_name, machine_queue
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.runner import experiment_node_run, experiment_run
from dashboard.experiments.runs.survival import experiments_reap_lost, experiments_redispatch_queued


@shared_task(bind=True, name="experiments.run_experiment", ignore_result=True, max_retries=None)
def run_experiment(self: Any, experiment_id: int, wake: bool = False) -> str | None:
    result = experiment_run(experiment_id=experiment_id, worker=machine_name())
    if result.kind == "routed":
        # Another machine's worker must claim it (pinned there, or a multi-node run this
        # machine cannot host now): the message moves to that machine's queue, nudge or not.
        run_experiment.apply_async(
            (experiment_id,), {"wake": wake}, queue=machine_queue(result.reason)
        )
        return None
    if result.kind == "waiting" and wake:
        # A nudge sent when a device freed (queue_wake.py): the run's own message keeps retrying.
        return None
    if result.kind == "waiting":
        # Devices are busy: ask again shortly, on the queue the message came from.
        raise self.retry(countdown=settings.TRAINYARD_WAIT_RETRY_SECONDS)
    return result.status


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
    result = experiment_node_run(
        experiment_id=experiment_id, attempt=attempt, node_rank=node_rank, worker=machine_name()
    )
    return result.status


@shared_task(name="experiments.reap_lost_runs", ignore_result=True)
def reap_lost_runs() -> dict[str, list[int]]:
    reaped = experiments_reap_lost()
    redispatched = experiments_redispatch_queued()
    # Committed already (a task runs in autocommit): a worker that takes one finds it queued.
    for experiment in Experiment.objects.filter(pk__in=[*reaped.requeued, *redispatched]):
        run_experiment_send(experiment=experiment)
    return {"lost": reaped.lost, "requeued": reaped.requeued, "redispatched": redispatched}
