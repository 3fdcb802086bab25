from django import forms
from django.contrib.auth.forms import PasswordChangeForm

from dashboard.accounts.services import EXPIRY_MAX_DAYS


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
    """Django's password change, and the user's choice to revoke their API tokens with it."""

    revoke_tokens = forms.BooleanField(
        required=False,
        label="Also revoke all my API tokens",
        help_text="Scripts and the trainyard command then need a new token.",
    )
