"""Celery tasks: thin, they take ids and call the services.

Services import these tasks to queue them (`experiment_launch`); nothing the tasks call imports
them back. The reaper returns the runs it queued again and the task here sends them.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from dashboard.devices.facts import machine_name
from dashboard.experiments.runner import experiment_run
from dashboard.experiments.survival import experiments_reap_lost, experiments_redispatch_queued


@shared_task(bind=True, name="experiments.run_experiment", ignore_result=True, max_retries=None)
def run_experiment(self: Any, experiment_id: int, wake: bool = False) -> str | None:
    result = experiment_run(experiment_id=experiment_id, worker=machine_name())
    if result.kind == "waiting" and wake:
        # A nudge sent when a device freed (queue_wake.py): the run's own message keeps retrying.
        return None
    if result.kind == "waiting":
        # Devices are busy: ask again shortly, from whichever worker takes the message.
        raise self.retry(countdown=settings.TRAINYARD_WAIT_RETRY_SECONDS)
    return result.status


@shared_task(name="experiments.reap_lost_runs", ignore_result=True)
def reap_lost_runs() -> dict[str, list[int]]:
    reaped = experiments_reap_lost()
    redispatched = experiments_redispatch_queued()
    # Committed already (a task runs in autocommit): a worker that takes one finds it queued.
    for experiment_id in [*reaped.requeued, *redispatched]:
        run_experiment.delay(experiment_id)
    return {"lost": reaped.lost, "requeued": reaped.requeued, "redispatched": redispatched}
