"""Token login for WebSockets: `Authorization: Bearer <key>` on the handshake, and what every
socket's login rests on, checked again while it is open.

Scripts (the `trainyard` command) have no session cookie. A browser cannot set this header on a
WebSocket, so a page of another site can never use it: the cookie-based check stays as it is,
and the origin check in front of it still applies. Keys never go in the URL (where proxies log
them).

A handshake's check would let an open socket outlive a logout, a password change, a
deactivation or the token's expiry. So the middleware hands the consumer the socket's login
(`scope["login"]`, a SocketLogin: the consumers are in apps below this one, which never import
it): the groups to join, where what ends or narrows the user's access is told (sockets.py; a
token's revocation: `token.revoked`), and `still()`, the check again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from dashboard.accounts.services import token_authenticate, token_group, tokens_live
from dashboard.accounts.sockets import session_digest, user_group


def bearer_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key of an `Authorization: Bearer` (or `Token`) header; None when there is none."""
    for name, value in headers:
        if name.lower() != b"authorization":
            continue
        scheme, _, key = value.decode("latin-1").partition(" ")
        if scheme.lower() in {"bearer", "token"}:
            return key.strip()
    return None


@database_sync_to_async
def token_of_key(key: str) -> Any:
    return token_authenticate(key=key)


class TokenAuthMiddleware:
    """Sets scope["user"] from a bearer token when the handshake carries one. Put it inside
    AuthMiddlewareStack, so that it overrides the session's user; a wrong, revoked or expired
    key makes the user anonymous (the consumer then closes with 4401), never the session's.
    A logged-in user's socket gets its SocketLogin in scope["login"]."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        key = bearer_key(scope.get("headers", []))
        token_id = None
        if key is not None:
            token = await token_of_key(key)
            user = AnonymousUser() if token is None else token.user
            token_id = None if token is None else token.pk
            scope = {**scope, "user": user}
        user = scope.get("user")
        if user is not None and user.is_authenticated:
            # A token overrides the session's user: the session is not what the socket rests on.
            session = None if token_id is not None else scope.get("session")
            session_key = getattr(session, "session_key", None)
            login = SocketLogin(user_id=user.pk, session_key=session_key, token_id=token_id)
            scope = {**scope, "login": login}
        return await self.inner(scope, receive, send)


@dataclass(frozen=True)
class LoginState:
    """A socket's login checked again: `user` where it holds, else None and `reconnect`: its
    session is gone from the store (a logout, or a password change that moved the session to a
    new key), so a new handshake, with the browser's cookie, decides."""

    user: Any | None
    reconnect: bool = False


LOST = LoginState(user=None)


@dataclass(frozen=True)
class SocketLogin:
    """What an open socket's login rests on: its user, and the session or the token it was
    opened with (neither: a scope made by hand, in tests)."""

    user_id: int
    session_key: str | None = None
    token_id: int | None = None

    @property
    def groups(self) -> list[str]:
        """Where the socket is told of changes: its user's group, and its token's."""
        token = [] if self.token_id is None else [token_group(self.token_id)]
        return [user_group(self.user_id), *token]

    def ended_by(self, message: Mapping[str, Any]) -> bool:
        """`access.check` tells of this socket's session logging out (sockets_recheck)."""
        ended, key = message.get("ended_session"), self.session_key
        return bool(ended) and key is not None and session_digest(key) == ended

    async def still(self) -> LoginState:
        return await database_sync_to_async(login_state)(login=self)


def login_state(*, login: SocketLogin) -> LoginState:
    """What the handshake checked, checked again now."""
    user = get_user_model().objects.filter(pk=login.user_id, is_active=True).first()
    if user is None:
        return LOST  # inactive or gone
    if login.token_id is not None:
        live = tokens_live(now=timezone.now()).filter(pk=login.token_id).exists()
        return LoginState(user=user) if live else LOST  # revoked or expired
    if login.session_key is not None:
        return _session_state(session_key=login.session_key, user=user)
    return LoginState(user=user)


def _session_state(*, session_key: str, user: Any) -> LoginState:
    # What django.contrib.auth.get_user checks for a request: the session names this user, and
    # its hash is of the user's password now (a password change ends the other sessions).
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key).load()
    if not data:
        return LoginState(user=None, reconnect=True)
    if str(data.get(SESSION_KEY)) != str(user.pk):
        return LOST
    if not constant_time_compare(data.get(HASH_SESSION_KEY, ""), user.get_session_auth_hash()):
        return LOST
    return LoginState(user=user)
