from __future__ import annotations

from typing import Any

from django import forms

from dashboard.notifications.models import NotificationSettings
from dashboard.notifications.webhooks import WebhookRefused, webhook_target


class NotificationSettingsForm(forms.ModelForm):
    webhook_url = forms.URLField(
        label="URL",
        required=False,
        max_length=500,
        assume_scheme="https",
        help_text="Receives a signed JSON POST when a run ends; a public address only.",
        # A text input with the URL keyboard: the stylesheet styles text inputs.
        widget=forms.TextInput(
            attrs={
                "placeholder": "https://example.com/hooks/runs",
                "inputmode": "url",
                "autocomplete": "url",
            }
        ),
    )

    class Meta:
        model = NotificationSettings
        fields = (
            "email_enabled", "email", "webhook_enabled", "webhook_url", "straggler_enabled",
            "stalled_enabled",
        )  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        user_email = getattr(self.instance.user, "email", "")
        if user_email:
            self.fields["email"].widget.attrs["placeholder"] = user_email

    def clean_webhook_url(self) -> str:
        url: str = self.cleaned_data.get("webhook_url", "")
        # URLField also takes ftp://; a webhook is an HTTP POST.
        if url and not url.lower().startswith(("http://", "https://")):
            raise forms.ValidationError("a webhook URL starts with http:// or https://")
        if url:
            # Checked again at each call (the name may resolve elsewhere by then).
            try:
                webhook_target(url)
            except WebhookRefused as exc:
                raise forms.ValidationError(str(exc)) from None
        return url

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("webhook_enabled") and not data.get("webhook_url"):
            self.add_error("webhook_url", "give the URL to call, or turn the webhook off")
        user_email = getattr(self.instance.user, "email", "")
        if data.get("email_enabled") and not (data.get("email") or user_email):
            self.add_error("email", "your account has no address: give one here")
        return data
