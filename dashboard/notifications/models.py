"""Who wants to hear when their runs end, and how (email, webhook); each message sent."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


def new_webhook_secret() -> str:
    return secrets.token_urlsafe(32)


class NotificationSettings(models.Model):
    """One per user, made on first visit of the settings page; both channels off until chosen."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_settings"
    )
    email_enabled = models.BooleanField("email me when a run ends", default=False)
    email = models.EmailField(blank=True, help_text="Empty: your account's address.")
    # The address whose owner followed the link mailed to it (verification.py), and when. Mail
    # goes only to an email_address equal to it: a changed address (here, or the account's) is
    # unverified until its own link is followed, so no one can make the dashboard mail others.
    email_verified = models.EmailField(blank=True)
    email_verified_at = models.DateTimeField(null=True, blank=True)
    webhook_enabled = models.BooleanField("call a webhook when a run ends", default=False)
    # On the channels chosen above, besides the run's end (dashboard.experiments' straggler_named
    # and run_stalled).
    straggler_enabled = models.BooleanField(
        "also when a rank of a run is named a straggler", default=False
    )
    stalled_enabled = models.BooleanField(
        "also when a run stalls: no step while its processes live", default=False
    )
    webhook_url = models.URLField(blank=True, max_length=500)
    # Kept in the clear: signing needs the secret itself, and the receiver holds a copy anyway.
    webhook_secret = models.CharField(max_length=64, default=new_webhook_secret)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "notification settings"
        verbose_name_plural = "notification settings"

    def __str__(self) -> str:
        return f"notifications of {self.user}"

    @property
    def email_address(self) -> str:
        return self.email or getattr(self.user, "email", "") or ""

    @property
    def email_address_verified(self) -> bool:
        return bool(self.email_address) and self.email_verified == self.email_address


class Channel(models.TextChoices):
    EMAIL = "email"
    WEBHOOK = "webhook"


class Kind(models.TextChoices):
    """What a message is about: a run's end, a rank of a running run named a straggler (the
    first one named: a run's stragglers after it are in its log and on its page), or a running
    run stalled (its first stall, likewise)."""

    RUN_END = "run_end"
    STRAGGLER = "straggler"
    STALLED = "stalled"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    # Claimed by one delivery_send task (pending -> sending is a conditional update), so two
    # copies of the task never both send; back to pending when a try failed and may be retried.
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"


class Delivery(models.Model):
    """One message about one run's end (or its first straggler, or its first stall) on one
    channel. Unique per run, channel and kind, so a task that runs twice sends once."""

    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.CASCADE, related_name="+"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.RUN_END)
    # A straggler's or a stall's sentence as the run's log said it when the message was made
    # (the run's row keeps only the current one); empty for a run's end, whose words come from
    # the run.
    text = models.TextField(blank=True)
    target = models.CharField(max_length=500, help_text="the address or URL it went to")
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    # When the last try began: a row pending (or sending) long after it was lost with its task.
    claimed_at = models.DateTimeField(null=True, blank=True)
    # Why the last try failed: an HTTP status code or an exception, never a reply's body.
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "channel", "kind"], name="one_delivery_per_run_channel_kind"
            )
        ]

    def __str__(self) -> str:
        return f"{self.channel} for run {self.experiment_id}: {self.state}"
