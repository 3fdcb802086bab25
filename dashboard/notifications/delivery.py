"""What the notification tasks do: decide who hears of a run's end, write the message, send it.

Webhooks are POSTed as JSON with `X-Trainyard-Signature: t=<unix time>,sha256=<hex>`, the
HMAC-SHA256 under the user's secret of `<unix time>.` followed by the exact body. The receiver
checks the HMAC (hmac.compare_digest) and that the time is recent (minutes), so a message
captured on the way cannot be replayed later. `X-Trainyard-Delivery` is the same on every retry
of one message, for receivers that must not act twice. Webhook targets are checked in
webhooks.py (no internal addresses).

Each try claims its row first (pending -> sending, one conditional update), so two copies of a
delivery_send task never both send.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

import urllib3
from django.conf import settings
from django.core.mail import BadHeaderError, send_mail
from django.db import IntegrityError
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from dashboard.experiments.core.descriptions import (
    experiment_dataset_label,
    experiment_devices_label,
    experiment_duration_seconds,
)
from dashboard.experiments.core.transitions import ENDS
from dashboard.experiments.models import Experiment
from dashboard.notifications.models import (
    Channel,
    Delivery,
    DeliveryState,
    Kind,
    NotificationSettings,
)
from dashboard.notifications.webhooks import WebhookRefused, webhook_post
from dashboard.texts import format_duration

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Trainyard-Signature"
DELIVERY_HEADER = "X-Trainyard-Delivery"
EVENT = "run.ended"
STRAGGLER_EVENT = "run.straggler"
STALLED_EVENT = "run.stalled"
WEBHOOK_TIMEOUT_SECONDS = 10
UNVERIFIED = "not sent: the address is not the owner's verified one"
# How much of an exception's words is kept to show on the settings page.
ERROR_CHARS = 300
# The sweep looks this far back for runs nobody was told about.
UNANNOUNCED_WITHIN = timezone.timedelta(days=1)
UNANNOUNCED_GRACE = timezone.timedelta(minutes=1)


@dataclass(frozen=True)
class Attempt:
    """How one try at sending went: sent, or why not and whether another try may help."""

    sent: bool
    retry: bool = False
    error: str = ""
    # Tries of this delivery so far, this one included; 0 when it was not ours to try (sent,
    # given up, or claimed by another task).
    attempts: int = 0


def webhook_signature(*, secret: str, body: bytes, timestamp: int) -> str:
    signed = f"{timestamp}.".encode() + body
    digest = hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},sha256={digest}"


def run_link(experiment: Experiment) -> str:
    return settings.TRAINYARD_PUBLIC_URL.rstrip("/") + experiment.get_absolute_url()


def run_end_subject(experiment: Experiment) -> str:
    accuracy = (
        f" (accuracy {experiment.test_accuracy:.1%})"
        if experiment.test_accuracy is not None
        else ""
    )
    subject = f"Trainyard: run #{experiment.pk} “{experiment.name}” {experiment.status}{accuracy}"
    # A header is one line: a name with a newline would make Django refuse the mail for good.
    return " ".join(subject.split())


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
    seconds = experiment_duration_seconds(experiment=experiment)
    devices = experiment_devices_label(experiment=experiment)
    dataset = experiment_dataset_label(experiment=experiment)
    took = "never started" if seconds is None else f"took {format_duration(seconds)}"
    lines.append(
        f"{experiment.get_strategy_display()}, {devices}, "
        f"{experiment.epochs} epoch(s) of {experiment.model} on {dataset}"
        f"{' on ' + experiment.worker if experiment.worker else ''}; "
        f"{took}."
    )
    lines.append(run_link(experiment))
    return "\n".join(lines)


@dataclass(frozen=True)
class News:
    """News of a running run, of one kind: the subject's words, the webhook's `event`, and the
    owner's switch for it (a field of NotificationSettings)."""

    subject: str
    event: str
    switch: str


NEWS: dict[str, News] = {
    Kind.STRAGGLER: News("has a straggler", STRAGGLER_EVENT, "straggler_enabled"),
    Kind.STALLED: News("is stalled", STALLED_EVENT, "stalled_enabled"),
}


def news_subject(delivery: Delivery) -> str:
    experiment = delivery.experiment
    subject = f"Trainyard: run #{experiment.pk} “{experiment.name}” {NEWS[delivery.kind].subject}"
    return " ".join(subject.split())


def news_text(delivery: Delivery) -> str:
    """The sentence as the run's log said it (a straggler's, a stall's), and a link to the run."""
    experiment = delivery.experiment
    said = f"Run #{experiment.pk} “{experiment.name}”: {delivery.text.rstrip('.')}."
    return "\n".join([said, run_link(experiment)])


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
            "model": experiment.model,
            "dataset": experiment.dataset,
            "data_path": experiment.data_path or None,
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
    # Mail only to an address its owner verified (verification.py); webhooks are the user's own.
    if prefs.email_enabled and prefs.email_address_verified:
        targets.append((Channel.EMAIL, prefs.email_address))
    if prefs.webhook_enabled and prefs.webhook_url:
        targets.append((Channel.WEBHOOK, prefs.webhook_url))
    return targets


def run_end_deliveries_create(*, experiment_id: int) -> list[int]:
    """The deliveries to send for a run that ended, by id; none for a run still going, an
    owner who opted out, or a run already announced."""
    experiment = Experiment.objects.select_related("owner").filter(pk=experiment_id).first()
    if experiment is None or experiment.status not in ENDS:
        return []
    return _deliveries_create(experiment=experiment, kind=Kind.RUN_END)


def news_deliveries_create(*, experiment_id: int, kind: str, text: str) -> list[int]:
    """The deliveries to send for news of a running run (``kind``: NEWS's, its first straggler
    or its first stall; ``text``: the log's sentence), by id; none for an owner who did not ask,
    or a run whose first one of that kind was announced."""
    experiment = Experiment.objects.select_related("owner").filter(pk=experiment_id).first()
    if experiment is None:
        return []
    return _deliveries_create(experiment=experiment, kind=kind, text=text)


def _deliveries_create(*, experiment: Experiment, kind: str, text: str = "") -> list[int]:
    prefs = NotificationSettings.objects.filter(user=experiment.owner).first()
    if prefs is None or (kind in NEWS and not getattr(prefs, NEWS[kind].switch)):
        return []
    created = []
    for channel, target in _targets(prefs):
        try:
            delivery, new = Delivery.objects.get_or_create(
                experiment=experiment,
                channel=channel,
                kind=kind,
                defaults={"user": experiment.owner, "target": target, "text": text},
            )
        except IntegrityError:  # a twin task made it at the same moment
            continue
        if new:
            created.append(delivery.pk)
    return created


def _claim(delivery_id: int) -> bool:
    """pending -> sending for this task alone; also a row left sending by a worker that died
    mid-try, once it is stale. False: sent, given up, or another task has it."""
    now = timezone.now()
    stale = now - timezone.timedelta(seconds=settings.TRAINYARD_NOTIFY_STALE_SECONDS)
    claimable = Q(state=DeliveryState.PENDING) | Q(
        state=DeliveryState.SENDING, claimed_at__lt=stale
    )
    claimed = Delivery.objects.filter(claimable, pk=delivery_id).update(
        state=DeliveryState.SENDING, claimed_at=now, attempts=F("attempts") + 1
    )
    return claimed == 1


def delivery_attempt(*, delivery_id: int) -> Attempt:
    """Claim one delivery, try to send it once, record the try."""
    if not _claim(delivery_id):
        return Attempt(sent=False)
    delivery = Delivery.objects.select_related("experiment__owner", "user").get(pk=delivery_id)
    try:
        if delivery.channel == Channel.EMAIL:
            attempt = _email_send(delivery)
        else:
            attempt = _webhook_post(delivery)
    except Exception as exc:  # noqa: BLE001 - a bug or an SMTP failure: record it, maybe retry
        logger.exception("notification %s failed", delivery.pk)
        attempt = Attempt(sent=False, retry=True, error=f"{type(exc).__name__}: {exc}")
    Delivery.objects.filter(pk=delivery.pk, state=DeliveryState.SENDING).update(
        last_error=attempt.error[:ERROR_CHARS],
        state=DeliveryState.SENT if attempt.sent else DeliveryState.PENDING,
        sent_at=timezone.now() if attempt.sent else None,
    )
    return Attempt(
        sent=attempt.sent, retry=attempt.retry, error=attempt.error, attempts=delivery.attempts
    )


def delivery_give_up(*, delivery_id: int) -> None:
    Delivery.objects.filter(pk=delivery_id, state=DeliveryState.PENDING).update(
        state=DeliveryState.FAILED
    )


def _email_send(delivery: Delivery) -> Attempt:
    experiment = delivery.experiment
    news = delivery.kind in NEWS
    # A delivery made before its address changed, or before addresses were verified at all:
    # never to an address that is not the owner's verified one.
    prefs = NotificationSettings.objects.filter(user=delivery.user).first()
    if prefs is None or not prefs.email_address_verified or prefs.email_address != delivery.target:
        return Attempt(sent=False, retry=False, error=UNVERIFIED)
    try:
        send_mail(
            news_subject(delivery) if news else run_end_subject(experiment),
            news_text(delivery) if news else run_end_text(experiment),
            None,  # DEFAULT_FROM_EMAIL
            [delivery.target],
        )
    except BadHeaderError as exc:
        # The same message would be refused the same way on every retry.
        return Attempt(sent=False, retry=False, error=f"BadHeaderError: {exc}")
    return Attempt(sent=True)


def _webhook_post(delivery: Delivery) -> Attempt:
    prefs = NotificationSettings.objects.get(user=delivery.user)
    payload = run_end_payload(experiment=delivery.experiment, delivery=delivery)
    if delivery.kind in NEWS:
        payload.update(event=NEWS[delivery.kind].event, text=news_text(delivery))
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")
    signature = webhook_signature(
        secret=prefs.webhook_secret, body=body, timestamp=int(timezone.now().timestamp())
    )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Trainyard-Webhook/1",
        SIGNATURE_HEADER: signature,
        DELIVERY_HEADER: str(delivery.pk),
    }
    try:
        status = webhook_post(
            delivery.target, body=body, headers=headers, timeout=WEBHOOK_TIMEOUT_SECONDS
        )
    except WebhookRefused as exc:
        return Attempt(sent=False, retry=False, error=f"refused: {exc}")
    except urllib3.exceptions.HTTPError as exc:
        return Attempt(sent=False, retry=True, error=f"no answer: {type(exc).__name__}: {exc}")
    if 200 <= status < 300:
        return Attempt(sent=True)
    # A server error or a rate limit may pass; any other answer will not change by itself.
    # Only the status is kept: the reply's body could be an internal page's.
    retry = status >= 500 or status in {408, 429}
    return Attempt(sent=False, retry=retry, error=f"HTTP {status}")


def runs_unannounced() -> list[int]:
    """Runs that ended in the last day, more than a minute ago, whose owner opted in, and that
    have no delivery yet: their run_end_notify was lost (broker down at the end, a worker that
    died holding it)."""
    now = timezone.now()
    opted_in = Q(owner__notification_settings__email_enabled=True) | Q(
        owner__notification_settings__webhook_enabled=True
    )
    announced = Delivery.objects.filter(experiment=OuterRef("pk"), kind=Kind.RUN_END)
    runs = Experiment.objects.filter(
        opted_in,
        status__in=ENDS,
        # A minute's grace: the on-commit task of a run that just ended goes first.
        finished_at__range=(now - UNANNOUNCED_WITHIN, now - UNANNOUNCED_GRACE),
    ).exclude(Exists(announced))
    return list(runs.values_list("pk", flat=True))


def deliveries_stale() -> list[int]:
    """Deliveries not sent whose last try (or creation) is older than
    TRAINYARD_NOTIFY_STALE_SECONDS: the task that should retry them is gone."""
    stale = timezone.now() - timezone.timedelta(seconds=settings.TRAINYARD_NOTIFY_STALE_SECONDS)
    untried_since = Q(claimed_at__lt=stale) | Q(claimed_at__isnull=True, created_at__lt=stale)
    rows = Delivery.objects.filter(
        untried_since, state__in=[DeliveryState.PENDING, DeliveryState.SENDING]
    )
    return list(rows.values_list("pk", flat=True))
