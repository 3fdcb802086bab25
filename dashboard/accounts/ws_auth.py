"""Token login for WebSockets: `Authorization: Bearer <key>` on the handshake.

Scripts (the `trainyard` command) have no session cookie. A browser cannot set this header on a
WebSocket, so a page of another site can never use it: the cookie-based check stays as it is,
and the origin check in front of it still applies. Keys never go in the URL (where proxies log
them). A socket opened with a token is in the token's group (`scope["token_group"]`), and
revoking the token closes it with 4401 (`token.revoked`).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from dashboard.accounts.services import token_authenticate, token_group


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
    AuthMiddlewareStack, so that it overrides the session's user; a wrong or revoked key makes
    the user anonymous (the consumer then closes with 4401), never the session's."""

    def __init__(self, inner: Any):
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        key = bearer_key(scope.get("headers", []))
        if key is not None:
            token = await token_of_key(key)
            if token is None:
                scope = {**scope, "user": AnonymousUser()}
            else:
                # The consumer joins the token's group, so that revoking the token closes it.
                scope = {**scope, "user": token.user, "token_group": token_group(token.pk)}
        return await self.inner(scope, receive, send)
