"""Celery tasks: thin, they take ids and call the services."""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import shared_task
from django.conf import settings

from dashboard.experiments.runner import WAITING, experiment_run
from dashboard.experiments.survival import experiments_reap_lost, experiments_redispatch_queued


def worker_name() -> str:
    return os.environ.get("TRAINYARD_WORKER_NAME") or socket.gethostname()


@shared_task(bind=True, name="experiments.run_experiment", ignore_result=True, max_retries=None)
def run_experiment(self: Any, experiment_id: int) -> str | None:
    outcome = experiment_run(experiment_id=experiment_id, worker=worker_name())
    if outcome == WAITING:
        # Devices are busy: ask again shortly, from whichever worker takes the message.
        raise self.retry(countdown=settings.TRAINYARD_WAIT_RETRY_SECONDS)
    return outcome


@shared_task(name="experiments.reap_lost_runs", ignore_result=True)
def reap_lost_runs() -> dict[str, list[int]]:
    return {
        "lost": experiments_reap_lost(),
        "redispatched": experiments_redispatch_queued(),
    }
