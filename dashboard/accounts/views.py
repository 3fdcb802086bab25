"""The Tokens page: each user makes named API tokens (the key shown once), sees when each was
last used, and revokes them."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.accounts.forms import TokenCreateForm
from dashboard.accounts.models import ApiToken
from dashboard.accounts.services import token_create, token_revoke, tokens_of


@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenCreateForm(request.POST or None)
    created: tuple[ApiToken, str] | None = None
    if request.method == "POST" and form.is_valid():
        # Rendered, not redirected: the key exists only in this response, never in a session.
        created = token_create(user=request.user, name=form.cleaned_data["name"])
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
