"""The run-end hook: run_ended (sent by experiments.transitions) queues the announcement."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from dashboard.notifications.tasks import run_end_notify

logger = logging.getLogger(__name__)


def _run_end_notify_send(experiment_id: int) -> None:
    try:
        # retry=False: with the broker down, fail at once (and log) rather than hold up the
        # supervisor that is settling the run. The sweep (tasks.notifications_sweep) queues it
        # again within a minute.
        run_end_notify.apply_async(args=[experiment_id], retry=False)
    except Exception:
        logger.exception("could not queue the end notification of run %s", experiment_id)


def notifications_queue(*, experiment_id: int) -> None:
    """Announce a run's end to its owner (email, webhook; whatever they opted into), once.

    Queued when the caller's transaction commits, so the task reads the final row; never
    raises into the caller and never waits for a delivery: the run settles regardless.
    """
    try:
        transaction.on_commit(lambda: _run_end_notify_send(experiment_id))
    except Exception:
        logger.exception("could not schedule the end notification of run %s", experiment_id)


def run_ended_receive(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
    """The receiver of experiments.signals.run_ended, connected in NotificationsConfig.ready."""
    notifications_queue(experiment_id=experiment_id)
