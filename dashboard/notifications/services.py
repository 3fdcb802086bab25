"""The run-end hook: call notifications_queue when a run reaches its end."""

from __future__ import annotations

import logging

from django.db import transaction

from dashboard.notifications.tasks import run_end_notify

logger = logging.getLogger(__name__)


def _run_end_notify_send(experiment_id: int) -> None:
    try:
        # retry=False: with the broker down, fail at once (and log) rather than hold up the
        # supervisor that is settling the run.
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
