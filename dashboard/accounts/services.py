"""Tokens: make one (its key returned once), find the one a request presents, revoke one."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from dashboard.accounts.models import ApiToken, token_key_hash
from dashboard.rates import RATE_WINDOW, rate_retry_after

log = logging.getLogger(__name__)

# A bearer key is "ty_" and 43 URL-safe characters; anything much longer is not one of ours and
# is not worth hashing.
MAX_KEY_CHARS = 200
# How exact "last used" on the Tokens page is: the page says "5 minutes ago", not seconds.
LAST_USED_EVERY = timedelta(seconds=60)


def token_create(*, user: Any, name: str = "") -> tuple[ApiToken, str]:
    """A new token and its key: the only time the key exists outside the client."""
    token = ApiToken.objects.create(user=user, name=name[:100])
    assert token.key is not None  # set by save() for a new token
    return token, token.key


class TokenRateLimited(Exception):
    """More tokens asked for in a minute than TRAINYARD_TOKEN_RATE_PER_MINUTE: the API's 429."""

    def __init__(self, *, made: int, most: int, retry_after: int) -> None:
        self.retry_after = retry_after
        self.message = (
            f"{made} tokens were made for this account in the last minute, the most allowed is "
            f"{most} a minute (TRAINYARD_TOKEN_RATE_PER_MINUTE); retry in {retry_after} s"
        )
        super().__init__(self.message)


def token_create_limited(*, user: Any, name: str = "") -> tuple[ApiToken, str]:
    """token_create within the per-user rate, for POST /api/tokens/; raises TokenRateLimited.
    The user's row lock makes two requests take turns, so both cannot pass the check at once."""
    with transaction.atomic():
        list(get_user_model().objects.select_for_update().filter(pk=user.pk).values_list("pk"))
        now = timezone.now()
        most = settings.TRAINYARD_TOKEN_RATE_PER_MINUTE
        recent = list(
            ApiToken.objects.filter(user=user, created_at__gt=now - RATE_WINDOW)
            .order_by("created_at")
            .values_list("created_at", flat=True)
        )
        retry_after = rate_retry_after(times=recent, most=most, now=now)
        if retry_after is not None:
            raise TokenRateLimited(made=len(recent), most=most, retry_after=retry_after)
        return token_create(user=user, name=name)


def token_authenticate(*, key: str) -> ApiToken | None:
    """The live token of an active user with this key, its use recorded; None otherwise."""
    key = key.strip()
    if not key or len(key) > MAX_KEY_CHARS:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=token_key_hash(key), revoked_at__isnull=True)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    # At most one write a minute per token: a script polling the API must not write on each
    # request. One conditional UPDATE, not save(): concurrent requests do not race on fields.
    now = timezone.now()
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_EVERY)
    ApiToken.objects.filter(stale, pk=token.pk).update(last_used_at=now)
    return token


def token_group(token_id: int) -> str:
    """The channel group of the WebSockets opened with a token (accounts.ws_auth)."""
    return f"token-{token_id}"


def token_revoke(*, token: ApiToken, by: Any) -> bool:
    """Revoke now: the next request with the key gets a 401 and every WebSocket opened with it
    is closed (4401). False if it was already revoked."""
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=by
    )
    if revoked != 1:
        return False
    group = token_group(token.pk)
    transaction.on_commit(lambda: _sockets_close(group))
    return True


def _sockets_close(group: str) -> None:
    # The revocation is committed whatever happens here: a socket that misses this message
    # fails its next reconnect (401), so an unreachable channel layer only logs.
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": "token.revoked"})
    except Exception:
        log.warning(
            "channel layer unreachable; the sockets of %s stay open until they reconnect", group
        )


def tokens_of(user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True)
