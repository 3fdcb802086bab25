"""A socket that lasts only as long as the login it was opened with.

The handshake checks the login once; a logout, a password change, a deactivation, a loss of
staff status, a token revoked or past its expiry must close a socket already open. The accounts
app, above this one, hands the consumer the socket's login in `scope["login"]`
(accounts.ws_auth.SocketLogin) and tells the groups it names when a user's access ends or
narrows (accounts.sockets: `access.check`, `token.revoked`); the socket checks it again then,
and every TRAINYARD_SOCKET_RECHECK_SECONDS for what changes untold (a token's expiry, a queryset
update). Where the login no longer holds: 4401; where it holds but the consumer's own rule no
longer lets the user see what the socket shows: 4403; where the session is gone from the store
but may live on under a new key (a password change keeps its own session): 4000, and the
page's reconnect lets the handshake decide.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from dashboard.experiments.core.messages import SocketClose

log = logging.getLogger(__name__)


class Login(Protocol):
    """accounts.ws_auth.SocketLogin, which this app does not import."""

    @property
    def groups(self) -> list[str]: ...

    def ended_by(self, message: Mapping[str, Any]) -> bool: ...

    async def still(self) -> Any: ...  # a LoginState: `user` (None: lost) and `reconnect`


class LoginWatched(AsyncJsonWebsocketConsumer):
    """A consumer whose socket closes when its login ends; it says its own rule in
    `still_allowed` and calls `login_watch_start` before it accepts, `login_watch_stop` in
    disconnect."""

    login: Login | None = None
    login_timer: asyncio.Task[None] | None = None
    login_closed = False  # closed for its login: later messages and checks have nothing to do

    async def still_allowed(self, user: Any) -> bool:
        raise NotImplementedError

    async def login_watch_start(self) -> None:
        self.login = self.scope.get("login")
        for group in self.login.groups if self.login is not None else []:
            await self.channel_layer.group_add(group, self.channel_name)

    def login_timer_start(self) -> None:
        """Once accepted: the periodic check."""
        if self.login is not None:
            every = settings.TRAINYARD_SOCKET_RECHECK_SECONDS
            self.login_timer = asyncio.create_task(self.login_recheck_every(every))

    async def login_watch_stop(self) -> None:
        if self.login_timer is not None:
            self.login_timer.cancel()
        for group in self.login.groups if self.login is not None else []:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def token_revoked(self, message: Mapping[str, Any]) -> None:
        await self.login_end(SocketClose.UNAUTHENTICATED)

    async def access_check(self, message: Mapping[str, Any]) -> None:
        login = self.login
        if login is None or self.login_closed:
            return
        if login.ended_by(message):
            await self.login_end(SocketClose.UNAUTHENTICATED)
            return
        state = await login.still()
        if state.user is None:
            await self.login_end(
                SocketClose.RESYNC if state.reconnect else SocketClose.UNAUTHENTICATED
            )
        elif not await self.still_allowed(state.user):
            await self.login_end(SocketClose.FORBIDDEN)

    async def login_end(self, code: SocketClose) -> None:
        if self.login_closed:
            return
        self.login_closed = True
        if self.login_timer is not None and self.login_timer is not asyncio.current_task():
            self.login_timer.cancel()
        await self.close(code=int(code))  # int(): autobahn refuses a close code of other types

    async def login_recheck_every(self, seconds: float) -> None:
        while not self.login_closed:
            await asyncio.sleep(seconds)
            try:
                await self.access_check({"type": "access.check"})
            except Exception:
                # The socket stays as it is until the next check (the database away: every
                # handshake would fail as well, and the page could not reconnect).
                log.warning("a socket's login check failed", exc_info=True)
