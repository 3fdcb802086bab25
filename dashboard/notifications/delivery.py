"""What the notification tasks do: decide who hears of a run's end, write the message, send it.

Webhooks are POSTed as JSON with `X-Trainyard-Signature: sha256=<hex>`, the HMAC-SHA256 of the
exact body under the user's secret, so the receiver can check that the message came from here
(compare with hmac.compare_digest). `X-Trainyard-Delivery` is the same on every retry of one
message, for receivers that must not act twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError
from django.db.models import F
from django.utils import timezone

from dashboard.experiments.models import Experiment, Status
from dashboard.notifications.models import (
    Channel,
    Delivery,
    DeliveryState,
    NotificationSettings,
)

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Trainyard-Signature"
DELIVERY_HEADER = "X-Trainyard-Delivery"
EVENT = "run.ended"
WEBHOOK_TIMEOUT_SECONDS = 10
# How much of a failing answer is kept to show on the settings page.
ERROR_CHARS = 300
ENDINGS = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.LOST})


@dataclass(frozen=True)
class Attempt:
    """How one try at sending went: sent, or why not and whether another try may help."""

    sent: bool
    retry: bool = False
    error: str = ""


def webhook_signature(*, secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def run_link(experiment: Experiment) -> str:
    return settings.TRAINYARD_PUBLIC_URL.rstrip("/") + experiment.get_absolute_url()


def _duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "never started"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def run_end_subject(experiment: Experiment) -> str:
    accuracy = (
        f" (accuracy {experiment.test_accuracy:.1%})"
        if experiment.test_accuracy is not None
        else ""
    )
    return f"Trainyard: run #{experiment.pk} “{experiment.name}” {experiment.status}{accuracy}"


def run_end_text(experiment: Experiment) -> str:
    """The message of both channels: how the run ended, its accuracy and a link."""
    lines = [f"Run #{experiment.pk} “{experiment.name}” {experiment.status}."]
    if experiment.test_accuracy is not None:
        loss = (
            f" (test loss {experiment.test_loss:.4f})" if experiment.test_loss is not None else ""
        )
        lines.append(f"Test accuracy: {experiment.test_accuracy:.2%}{loss}")
    else:
        lines.append("Test accuracy: none (the run did not reach an evaluation)")
    if experiment.error:
        lines.append(f"Why: {experiment.error[:1000]}")
    lines.append(
        f"{experiment.get_strategy_display()}, {experiment.devices_label()}, "
        f"{experiment.epochs} epoch(s) of {experiment.get_dataset_display()}"
        f"{' on ' + experiment.worker if experiment.worker else ''}; "
        f"{_duration_text(experiment.duration_seconds)}."
    )
    lines.append(run_link(experiment))
    return "\n".join(lines)


def run_end_payload(*, experiment: Experiment, delivery: Delivery) -> dict[str, Any]:
    finished = experiment.finished_at.isoformat() if experiment.finished_at else None
    return {
        "event": EVENT,
        "delivery": delivery.pk,
        "experiment": {
            "id": experiment.pk,
            "name": experiment.name,
            "owner": experiment.owner.get_username(),
            "status": experiment.status,
            "strategy": experiment.strategy,
            "processes": experiment.processes,
            "dataset": experiment.dataset,
            "epochs": experiment.epochs,
            "test_accuracy": experiment.test_accuracy,
            "test_loss": experiment.test_loss,
            "error": experiment.error,
            "finished_at": finished,
            "url": run_link(experiment),
        },
        "text": run_end_text(experiment),
    }


def _targets(prefs: NotificationSettings) -> list[tuple[str, str]]:
    targets = []
    if prefs.email_enabled and prefs.email_address:
        targets.append((Channel.EMAIL, prefs.email_address))
    if prefs.webhook_enabled and prefs.webhook_url:
        targets.append((Channel.WEBHOOK, prefs.webhook_url))
    return targets


def run_end_deliveries_create(*, experiment_id: int) -> list[int]:
    """The deliveries to send for a run that ended, by id; none for a run still going, an
    owner who opted out, or a run already announced."""
    experiment = Experiment.objects.select_related("owner").filter(pk=experiment_id).first()
    if experiment is None or experiment.status not in ENDINGS:
        return []
    prefs = NotificationSettings.objects.filter(user=experiment.owner).first()
    if prefs is None:
        return []
    created = []
    for channel, target in _targets(prefs):
        try:
            delivery, new = Delivery.objects.get_or_create(
                experiment=experiment,
                channel=channel,
                defaults={"user": experiment.owner, "target": target},
            )
        except IntegrityError:  # a twin task made it at the same moment
            continue
        if new:
            created.append(delivery.pk)
    return created


def delivery_attempt(*, delivery_id: int) -> Attempt:
    """Try to send one delivery once and record the try."""
    delivery = Delivery.objects.select_related("experiment__owner", "user").get(pk=delivery_id)
    if delivery.state == DeliveryState.SENT:
        return Attempt(sent=True)
    try:
        if delivery.channel == Channel.EMAIL:
            attempt = _email_send(delivery)
        else:
            attempt = _webhook_post(delivery)
    except Exception as exc:  # noqa: BLE001 - a bug or an SMTP failure: record it, maybe retry
        logger.exception("notification %s failed", delivery.pk)
        attempt = Attempt(sent=False, retry=True, error=f"{type(exc).__name__}: {exc}")
    Delivery.objects.filter(pk=delivery.pk).update(
        attempts=F("attempts") + 1,
        last_error=attempt.error[:ERROR_CHARS],
        state=DeliveryState.SENT if attempt.sent else delivery.state,
        sent_at=timezone.now() if attempt.sent else None,
    )
    return attempt


def delivery_give_up(*, delivery_id: int) -> None:
    Delivery.objects.filter(pk=delivery_id).exclude(state=DeliveryState.SENT).update(
        state=DeliveryState.FAILED
    )


def _email_send(delivery: Delivery) -> Attempt:
    experiment = delivery.experiment
    send_mail(
        run_end_subject(experiment),
        run_end_text(experiment),
        None,  # DEFAULT_FROM_EMAIL
        [delivery.target],
    )
    return Attempt(sent=True)


def _webhook_post(delivery: Delivery) -> Attempt:
    prefs = NotificationSettings.objects.get(user=delivery.user)
    payload = run_end_payload(experiment=delivery.experiment, delivery=delivery)
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Trainyard-Webhook/1",
        SIGNATURE_HEADER: webhook_signature(secret=prefs.webhook_secret, body=body),
        DELIVERY_HEADER: str(delivery.pk),
    }
    try:
        response = requests.post(
            delivery.target,
            data=body,
            headers=headers,
            timeout=WEBHOOK_TIMEOUT_SECONDS,
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        return Attempt(sent=False, retry=True, error=f"{type(exc).__name__}: {exc}")
    if 200 <= response.status_code < 300:
        return Attempt(sent=True)
    # A server error or a rate limit may pass; any other answer will not change by itself.
    retry = response.status_code >= 500 or response.status_code in {408, 429}
    return Attempt(sent=False, retry=retry, error=f"HTTP {response.status_code}: {response.text}")
