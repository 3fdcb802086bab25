"""The Notifications page: opt in to an email and/or a webhook when a run ends."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.notifications.delivery import SIGNATURE_HEADER
from dashboard.notifications.forms import NotificationSettingsForm
from dashboard.notifications.models import Delivery, NotificationSettings, new_webhook_secret

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
