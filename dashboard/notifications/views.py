"""The Notifications page: opt in to an email and/or a webhook when a run ends."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.notifications.delivery import SIGNATURE_HEADER
from dashboard.notifications.forms import NotificationSettingsForm
from dashboard.notifications.models import Delivery, NotificationSettings, new_webhook_secret
from dashboard.notifications.tasks import email_verify_send
from dashboard.notifications.verification import email_verify, email_verify_mail_refusal

logger = logging.getLogger(__name__)
RECENT_DELIVERIES = 20


def _prefs(user: Any) -> NotificationSettings:
    prefs, _ = NotificationSettings.objects.get_or_create(user=user)
    return prefs


@require_http_methods(["GET", "POST"])
def notification_settings(request: HttpRequest) -> HttpResponse:
    prefs = _prefs(request.user)
    form = NotificationSettingsForm(request.POST or None, instance=prefs)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Notification settings saved.")
        return redirect("notification-settings")
    context = {
        "form": form,
        "prefs": prefs,
        "signature_header": SIGNATURE_HEADER,
        "verify_hours": settings.TRAINYARD_EMAIL_VERIFY_SECONDS // 3600,
        "deliveries": Delivery.objects.filter(user=request.user).select_related("experiment")[
            :RECENT_DELIVERIES
        ],
    }
    return render(request, "notifications/settings.html", context)


@require_POST
def webhook_secret_renew(request: HttpRequest) -> HttpResponse:
    prefs = _prefs(request.user)
    prefs.webhook_secret = new_webhook_secret()
    prefs.save(update_fields=["webhook_secret", "updated_at"])
    messages.success(request, "New webhook secret: update your receiver.")
    return redirect("notification-settings")


@require_POST
def email_verify_send_view(request: HttpRequest) -> HttpResponse:
    prefs = _prefs(request.user)
    refused = email_verify_mail_refusal(prefs=prefs)
    if refused:
        messages.error(request, refused)
    else:
        address = prefs.email_address
        try:
            # retry=False: with the broker down, say so now rather than hold the page.
            email_verify_send.apply_async(args=[prefs.user_id, address], retry=False)
        except Exception:
            logger.exception("could not queue the verification mail of user %s", prefs.user_id)
            messages.error(request, "The mail could not be queued: try again in a minute.")
        else:
            messages.success(request, f"A link is on its way to {address}: open it to verify.")
    return redirect("notification-settings")


@require_http_methods(["GET"])
def email_verify_view(request: HttpRequest, token: str) -> HttpResponse:
    """The mailed link: the page then says whether the address is verified."""
    refused = email_verify(user=request.user, token=token)
    if refused:
        messages.error(request, refused)
    else:
        messages.success(request, "Address verified: notifications by email go to it.")
    return redirect("notification-settings")
