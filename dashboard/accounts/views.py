"""The Tokens page: each user makes named API tokens (the key shown once), with an expiry or
none, sees when each was last used and when it expires, and revokes them. The password change,
which may revoke them all."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse_lazy
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.accounts.forms import PasswordChangeRevokingForm, TokenCreateForm
from dashboard.accounts.models import ApiToken
from dashboard.accounts.services import (
    token_create,
    token_expiry,
    token_revoke,
    tokens_of,
    tokens_revoke_all,
)


@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenCreateForm(request.POST or None)
    created: tuple[ApiToken, str] | None = None
    if request.method == "POST" and form.is_valid():
        # Rendered, not redirected: the key exists only in this response, never in a session.
        expires_at = token_expiry(days=form.cleaned_data["expires_in_days"])
        created = token_create(
            user=request.user, name=form.cleaned_data["name"], expires_at=expires_at
        )
        form = TokenCreateForm()
    context = {
        "form": form,
        "tokens": tokens_of(request.user),
        "created": created[0] if created else None,
        "created_key": created[1] if created else None,
        "base_url": request.build_absolute_uri("/").rstrip("/"),
    }
    response = render(request, "accounts/token_list.html", context)
    if created:
        response["Cache-Control"] = "no-store"
    return response


@require_POST
def token_revoke_view(request: HttpRequest, pk: int) -> HttpResponse:
    # Another user's token is a 404, not a 403: its existence is not theirs to learn. Staff
    # revoke other people's tokens in the admin.
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    if token_revoke(token=token, by=request.user):
        messages.success(request, f"Revoked “{token.name or token.prefix}”: it no longer works.")
    return redirect("token-list")


class PasswordChangeView(auth_views.PasswordChangeView):
    """Django's, which keeps this session (its login hash renewed) and ends the others: their
    next request logs out, and their open sockets close (accounts/sockets.py)."""

    form_class = PasswordChangeRevokingForm
    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("token-list")

    def get_form_kwargs(self) -> dict[str, Any]:
        # The client's address, for the login limits its old password is checked under.
        return {**super().get_form_kwargs(), "request": self.request}

    def form_valid(self, form: Any) -> HttpResponse:
        # One transaction: the sockets are told once this session holds the new hash too, so
        # that only the other sessions' sockets find theirs stale.
        with transaction.atomic():
            response = super().form_valid(form)
            done = "Your password was changed; your other sessions are logged out."
            if form.cleaned_data["revoke_tokens"]:
                count = tokens_revoke_all(user=form.user, by=form.user)
                done += f" Revoked {count} API token(s)."
        messages.success(self.request, done)
        return response
