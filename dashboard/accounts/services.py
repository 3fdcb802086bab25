"""Tokens: make one (its key returned once, with an expiry or none), find the one a request
presents, revoke one or all of a user's."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from dashboard.accounts.models import ApiToken, token_key_hash
from dashboard.accounts.sockets import sockets_recheck, sockets_tell
from dashboard.rates import RATE_WINDOW, rate_retry_after

# A bearer key is "ty_" and 43 URL-safe characters; anything much longer is not one of ours and
# is not worth hashing.
MAX_KEY_CHARS = 200
# How exact "last used" on the Tokens page is: the page says "5 minutes ago", not seconds.
LAST_USED_EVERY = timedelta(seconds=60)
# The longest expiry a token may be given, in days (about ten years); none at all is allowed.
EXPIRY_MAX_DAYS = 3650


def token_expiry(*, days: int | None) -> datetime | None:
    """When a token made now for `days` days stops working (None: days None, never)."""
    return None if days is None else timezone.now() + timedelta(days=days)


def token_create(
    *, user: Any, name: str = "", expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """A new token and its key: the only time the key exists outside the client. `expires_at`:
    when it stops working (None: when it is revoked)."""
    token = ApiToken.objects.create(user=user, name=name[:100], expires_at=expires_at)
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


def token_create_limited(
    *, user: Any, name: str = "", expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
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
        return token_create(user=user, name=name, expires_at=expires_at)


def tokens_live(*, now: datetime) -> QuerySet[ApiToken]:
    """Tokens that work at `now`: not revoked, not expired, their user active."""
    unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    return ApiToken.objects.filter(unexpired, revoked_at__isnull=True, user__is_active=True)


def token_authenticate(*, key: str) -> ApiToken | None:
    """The live token with this key, its use recorded; None otherwise."""
    key = key.strip()
    if not key or len(key) > MAX_KEY_CHARS:
        return None
    now = timezone.now()
    token = tokens_live(now=now).select_related("user").filter(key_hash=token_key_hash(key)).first()
    if token is None:
        return None
    # At most one write a minute per token: a script polling the API must not write on each
    # request. One conditional UPDATE, not save(): concurrent requests do not race on fields.
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
    transaction.on_commit(lambda: sockets_tell(group=group, message={"type": "token.revoked"}))
    return True


def tokens_revoke_all(*, user: Any, by: Any) -> int:
    """Revoke every token of `user` now (a password change, by the user's choice); how many.
    Their sockets are closed by their user's check (sockets.py)."""
    revoked = ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=by
    )
    if revoked:
        sockets_recheck(user_id=user.pk)
    return revoked


def tokens_of(user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True)
