"""Celery tasks: thin, they take ids and call the service."""

from __future__ import annotations

import os
import socket

from celery import shared_task

from dashboard.experiments.runner import experiment_run


def worker_name() -> str:
    return os.environ.get("TRAINYARD_WORKER_NAME") or socket.gethostname()


@shared_task(name="experiments.run_experiment", ignore_result=True)
def run_experiment(experiment_id: int) -> str | None:
    return experiment_run(experiment_id=experiment_id, worker=worker_name())
