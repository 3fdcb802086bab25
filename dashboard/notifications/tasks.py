"""Thin tasks: announce a run's end, send one message with retries and backoff, and a sweep
(celery beat, every minute) for announcements and retries that were lost.

Why a sweep: the announcement is queued once, on commit, with the broker perhaps down; a retry
waits in the broker with a countdown, and a worker restarted meanwhile may take it along. The
sweep finds both in the database, and delivery_attempt's claim makes a copy harmless.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from dashboard.notifications.delivery import (
    deliveries_stale,
    delivery_attempt,
    delivery_give_up,
    news_deliveries_create,
    run_end_deliveries_create,
    runs_unannounced,
)
from dashboard.notifications.models import Kind
from dashboard.notifications.verification import email_verify_mail_send


@shared_task(name="notifications.run_end_notify", ignore_result=True)
def run_end_notify(experiment_id: int) -> None:
    for delivery_id in run_end_deliveries_create(experiment_id=experiment_id):
        delivery_send.delay(delivery_id)


@shared_task(name="notifications.straggler_notify", ignore_result=True)
def straggler_notify(experiment_id: int, text: str) -> None:
    _news_send(experiment_id=experiment_id, kind=Kind.STRAGGLER, text=text)


@shared_task(name="notifications.stalled_notify", ignore_result=True)
def stalled_notify(experiment_id: int, text: str) -> None:
    _news_send(experiment_id=experiment_id, kind=Kind.STALLED, text=text)


def _news_send(*, experiment_id: int, kind: str, text: str) -> None:
    """Queue the deliveries of news of a running run (its first straggler, its first stall)."""
    for delivery_id in news_deliveries_create(experiment_id=experiment_id, kind=kind, text=text):
        delivery_send.delay(delivery_id)


@shared_task(name="notifications.delivery_send", bind=True, ignore_result=True, max_retries=None)
def delivery_send(self: Any, delivery_id: int) -> None:
    attempt = delivery_attempt(delivery_id=delivery_id)
    if attempt.sent or not attempt.attempts:  # sent, or not ours to send
        return
    # Counted on the row, not by Celery: a delivery the sweep queued again keeps its count.
    if not attempt.retry or attempt.attempts > settings.TRAINYARD_NOTIFY_MAX_RETRIES:
        delivery_give_up(delivery_id=delivery_id)
        return
    # Exponential backoff: base, 2 x base, 4 x base, ... (10 s, 20 s, 40 s by default).
    countdown = settings.TRAINYARD_NOTIFY_BACKOFF_SECONDS * 2 ** (attempt.attempts - 1)
    raise self.retry(countdown=countdown)


@shared_task(name="notifications.email_verify_send", ignore_result=True)
def email_verify_send(user_id: int, address: str) -> None:
    """A worker mails the verification link: the web request never waits on the mail server."""
    email_verify_mail_send(user_id=user_id, address=address)


@shared_task(name="notifications.notifications_sweep", ignore_result=True)
def notifications_sweep() -> None:
    for experiment_id in runs_unannounced():
        run_end_notify.delay(experiment_id)
    for delivery_id in deliveries_stale():
        delivery_send.delay(delivery_id)
