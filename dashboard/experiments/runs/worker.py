"""Celery hookup: a worker that shuts down ends the training it supervises.

Warm shutdown waits for running tasks, and a training task can run for days: so the runs this
worker supervises are ended (their whole process trees), their supervisors see the exit and mark
them failed with the reason, and the worker can stop.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready, worker_shutting_down

from dashboard.devices.facts import machine_name
from dashboard.experiments.runs.runner import experiments_stop_for_worker_shutdown
from dashboard.experiments.runs.survival import training_orphans_end

log = logging.getLogger(__name__)


@worker_shutting_down.connect(dispatch_uid="trainyard-experiments-shutting-down")
def worker_shutting_down_stop_runs(sender: Any = None, **kwargs: Any) -> None:
    try:
        experiments_stop_for_worker_shutdown(worker=machine_name())
    except Exception:
        log.exception("could not end the runs of this worker")


@worker_ready.connect(dispatch_uid="trainyard-experiments-worker-ready")
def worker_ready_end_orphans(sender: Any = None, **kwargs: Any) -> None:
    try:
        ended = training_orphans_end()
    except Exception:
        log.exception("could not look for orphaned training processes")
        return
    if ended:
        log.warning("ended %d orphaned training process(es): %s", len(ended), ended)
