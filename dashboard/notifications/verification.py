"""An email address gets notifications only once its owner has followed a link mailed to it.

Without this, anyone with an account could make the dashboard mail any address (a run's end,
an imported run's, at will). The link carries a token signed with SECRET_KEY (django.core.
signing, timestamped: TRAINYARD_EMAIL_VERIFY_SECONDS) naming the user and the address; following
it, logged in as that user, while the address is still theirs, records the address as verified
(NotificationSettings.email_verified). A changed address is unverified again by itself.
Verification mails are few: VERIFY_MAILS_PER_HOUR per user, since they too go to an address
nobody has verified yet.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.mail import send_mail
from django.urls import reverse
from django.utils import timezone

from dashboard.notifications.models import NotificationSettings
from dashboard.rates import rate_event_record, rate_events_recent, rate_retry_after

SALT = "trainyard.notifications.email-verify"
VERIFY_MAILS_PER_HOUR = 3
VERIFY_MAILS = "verify-mail"
VERIFY_MAILS_WINDOW = timedelta(hours=1)
SUBJECT = "Trainyard: is this your address?"


def email_verify_token(*, user_id: int, address: str) -> str:
    return signing.dumps({"user": user_id, "address": address}, salt=SALT)


def email_verify_link(*, user_id: int, address: str) -> str:
    token = email_verify_token(user_id=user_id, address=address)
    path = reverse("notification-email-verify", args=[token])
    return settings.TRAINYARD_PUBLIC_URL.rstrip("/") + path


def email_verify_text(*, username: str, address: str, link: str) -> str:
    hours = settings.TRAINYARD_EMAIL_VERIFY_SECONDS // 3600
    return "\n".join(
        [
            f"Trainyard's user {username} asked for notifications at {address}.",
            f"If that is you, open this link (logged in as {username}) within {hours} hours:",
            link,
            "If not, ignore this mail: nothing is sent to this address without it.",
        ]
    )


def email_verify_mail_send(*, user_id: int, address: str) -> None:
    """Mail the link to `address` (what the Celery task does); nothing if it is no longer the
    user's address or is verified already."""
    prefs = NotificationSettings.objects.select_related("user").filter(user_id=user_id).first()
    if prefs is None or prefs.email_address != address or prefs.email_address_verified:
        return
    username = prefs.user.get_username()
    link = email_verify_link(user_id=user_id, address=address)
    send_mail(
        SUBJECT, email_verify_text(username=username, address=address, link=link), None, [address]
    )


def email_verify_mail_refusal(*, prefs: NotificationSettings) -> str | None:
    """Why no verification mail may go now, or None after counting this one."""
    if not prefs.email_address:
        return "Give an address first."
    if prefs.email_address_verified:
        return f"{prefs.email_address} is verified already."
    now, key = timezone.now(), str(prefs.user_id)
    times = rate_events_recent(kind=VERIFY_MAILS, key=key, now=now, window=VERIFY_MAILS_WINDOW)
    retry = rate_retry_after(
        times=times, most=VERIFY_MAILS_PER_HOUR, now=now, window=VERIFY_MAILS_WINDOW
    )
    if retry is not None:
        minutes = -(-retry // 60)
        return (
            f"{len(times)} verification mails were sent in the last hour, the most is "
            f"{VERIFY_MAILS_PER_HOUR}: try again in {minutes} minute{'s' if minutes > 1 else ''}."
        )
    rate_event_record(kind=VERIFY_MAILS, keys=[key], now=now, window=VERIFY_MAILS_WINDOW)
    return None


def email_verify(*, user: Any, token: str) -> str | None:
    """Record the token's address as verified for `user`; None, or why not."""
    try:
        signed = signing.loads(token, salt=SALT, max_age=settings.TRAINYARD_EMAIL_VERIFY_SECONDS)
    except signing.SignatureExpired:
        return "This link has expired: send a new one."
    except signing.BadSignature:
        return "This link is not one we sent (is it whole?)."
    if signed.get("user") != user.pk:
        return "This link verifies another account's address: log in as that account."
    prefs = NotificationSettings.objects.filter(user=user).first()
    address = signed.get("address")
    if prefs is None or prefs.email_address != address:
        return f"{address} is no longer your notification address: nothing verified."
    NotificationSettings.objects.filter(pk=prefs.pk).update(
        email_verified=address, email_verified_at=timezone.now()
    )
    return None
