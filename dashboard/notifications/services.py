"""The hooks: run_ended (sent by experiments.transitions) queues the announcement of a run's
end, straggler_named (sent by experiments' runs/stragglers.py) that of its straggler, and
run_stalled (runs/stalls.py) that of its stall."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from django.db import transaction

from dashboard.notifications.tasks import run_end_notify, stalled_notify, straggler_notify

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


def _news_notify_send(task: Task, experiment_id: int, text: str) -> None:
    try:
        # retry=False: the supervisor that said it must not wait for the broker; a lost one is
        # lost (the run's log and page still say it).
        task.apply_async(args=[experiment_id, text], retry=False)
    except Exception:
        logger.exception("could not queue %s of run %s", task.name, experiment_id)


def _news_queue(task: Task, *, experiment_id: int, text: str) -> None:
    """Queued when the transaction that stores the news (the row's change, its line and its
    message) commits; the owner's choice is read by the task. Never raises into the run."""
    try:
        transaction.on_commit(lambda: _news_notify_send(task, experiment_id, text))
    except Exception:
        logger.exception("could not schedule %s of run %s", task.name, experiment_id)


def straggler_named_receive(sender: Any, *, experiment_id: int, text: str, **kwargs: Any) -> None:
    """The receiver of experiments.signals.straggler_named: a rank named a straggler."""
    _news_queue(straggler_notify, experiment_id=experiment_id, text=text)


def run_stalled_receive(sender: Any, *, experiment_id: int, text: str, **kwargs: Any) -> None:
    """The receiver of experiments.signals.run_stalled: a run's ranks stalled."""
    _news_queue(stalled_notify, experiment_id=experiment_id, text=text)
