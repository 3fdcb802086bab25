"""Thin tasks: announce a run's end, send one message with retries and backoff."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from dashboard.notifications.delivery import (
    delivery_attempt,
    delivery_give_up,
    run_end_deliveries_create,
)


@shared_task(name="notifications.run_end_notify", ignore_result=True)
def run_end_notify(experiment_id: int) -> None:
    for delivery_id in run_end_deliveries_create(experiment_id=experiment_id):
        delivery_send.delay(delivery_id)


@shared_task(name="notifications.delivery_send", bind=True, ignore_result=True, max_retries=None)
def delivery_send(self: Any, delivery_id: int) -> None:
    attempt = delivery_attempt(delivery_id=delivery_id)
    if attempt.sent:
        return
    if not attempt.retry or self.request.retries >= settings.TRAINYARD_NOTIFY_MAX_RETRIES:
        delivery_give_up(delivery_id=delivery_id)
        return
    # Exponential backoff: base, 2 x base, 4 x base, ... (10 s, 20 s, 40 s by default).
    countdown = settings.TRAINYARD_NOTIFY_BACKOFF_SECONDS * 2**self.request.retries
    raise self.retry(countdown=countdown)
