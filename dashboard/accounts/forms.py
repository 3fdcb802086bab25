from typing import Any

from django import forms
from django.contrib.auth.forms import PasswordChangeForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from dashboard.accounts.services import EXPIRY_MAX_DAYS
from dashboard.accounts.throttles import password_check_throttled


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        required=False,
        help_text="What the token is for, e.g. “laptop” or “CI”.",
        widget=forms.TextInput(attrs={"placeholder": "laptop"}),
    )
    expires_in_days = forms.IntegerField(
        min_value=1,
        max_value=EXPIRY_MAX_DAYS,
        required=False,
        label="Expires in (days)",
        help_text="Empty: it works until you revoke it.",
        widget=forms.NumberInput(attrs={"placeholder": "90"}),
    )


class PasswordChangeRevokingForm(PasswordChangeForm):
    """Django's password change, and the user's choice to revoke their API tokens with it. Its
    old password is checked under the login limits (throttles.py)."""

    revoke_tokens = forms.BooleanField(
        required=False,
        label="Also revoke all my API tokens",
        help_text="Scripts and the trainyard command then need a new token.",
    )

    def __init__(self, user: Any, *args: Any, request: HttpRequest | None = None, **kwargs: Any):
        super().__init__(user, *args, **kwargs)
        self.request = request

    def clean_old_password(self) -> str:
        old: str = self.cleaned_data["old_password"]
        if not password_check_throttled(user=self.user, password=old, request=self.request):
            raise ValidationError(
                self.error_messages["password_incorrect"], code="password_incorrect"
            )
        return old
