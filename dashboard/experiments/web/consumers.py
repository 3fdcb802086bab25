"""The live channel of one experiment: /ws/experiments/<id>/.

On connect it sends a snapshot of what the database holds (its series, bucketed, and last logs),
then every later event, each sent once it is stored, in `seq` order as a rule (two processes that
write one run may send theirs in the other order). Clients drop what they already have (seq <=
snapshot's) and reconnect on a gap, so nothing is lost when the channel layer drops, the socket
breaks or two sends cross. Every
message it sends is typed and described in `messages.py`.

The socket lasts only as long as the login it was opened with and the owner-or-staff rule that
let it in (socket_login.py).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from dashboard.experiments.core.access import experiments_visible_to
from dashboard.experiments.core.messages import (
    ErrorMessage,
    GroupEvents,
    SnapshotMessage,
    SocketClose,
)
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.broadcast import experiment_group
from dashboard.experiments.selectors import experiment_snapshot_build
from dashboard.experiments.web.socket_login import LoginWatched

SNAPSHOT_LOG_LINES = 200
# The channel is one-way, so a client has nothing sizable to say: a frame over this closes the
# connection (1009, "message too big"). daphne refuses frames over its own
# --websocket-max-frame-size / --websocket-max-message-size (1 MiB unless set; see Procfile).
MAX_CLIENT_FRAME_BYTES = 4096
CLOSE_TOO_BIG = 1009
# Ids longer than this cannot be a row's (64-bit) and int() refuses over 4,300 digits.
PK_MAX_DIGITS = 18


def experiment_pk_parse(raw: Any) -> int | None:
    text = str(raw)
    if not (text.isascii() and text.isdigit() and len(text) <= PK_MAX_DIGITS):
        return None
    return int(text)


def frame_size(*, text_data: str | None, bytes_data: bytes | None) -> int:
    if bytes_data is not None:
        return len(bytes_data)
    # surrogatepass: a test client can send lone surrogates that daphne never would.
    return len((text_data or "").encode("utf-8", "surrogatepass"))


@database_sync_to_async
def experiment_visible(*, pk: int, user: Any) -> bool:
    return experiments_visible_to(user).filter(pk=pk).exists()


@database_sync_to_async
def experiment_snapshot(*, pk: int) -> SnapshotMessage:
    experiment = Experiment.objects.select_related("owner", "cancelled_by").get(pk=pk)
    return experiment_snapshot_build(experiment=experiment, log_lines=SNAPSHOT_LOG_LINES)


class ExperimentConsumer(LoginWatched):
    group_name: str | None = None
    pk: int | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # int(): autobahn, under daphne, refuses a close code of any other type.
            await self.close(code=int(SocketClose.UNAUTHENTICATED))
            return
        pk = experiment_pk_parse(self.scope["url_route"]["kwargs"]["pk"])
        if pk is None or not await experiment_visible(pk=pk, user=user):
            await self.close(code=int(SocketClose.FORBIDDEN))
            return
        # Join before reading the snapshot: an event stored in between then arrives twice
        # (dropped by seq) instead of never.
        self.pk, self.group_name = pk, experiment_group(pk)
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.login_watch_start()  # its user's group, and its token's: told of changes
        await self.accept()
        await self.send_json(await experiment_snapshot(pk=pk))
        self.login_timer_start()

    async def disconnect(self, code: int) -> None:
        await self.login_watch_stop()
        if self.group_name is not None:
            await self.channel_layer.group_discard(self.group_name, self.channel_name)

    async def still_allowed(self, user: Any) -> bool:
        # Staff see every run, a user their own: a user no longer staff loses others' runs.
        return self.pk is not None and await experiment_visible(pk=self.pk, user=user)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # The channel is one-way: whatever a client sends, even invalid JSON, is answered with an
        # error and never decoded or acted on.
        if frame_size(text_data=text_data, bytes_data=bytes_data) > MAX_CLIENT_FRAME_BYTES:
            await self.close(code=CLOSE_TOO_BIG)
            return
        refusal: ErrorMessage = {"type": "error", "error": "this channel accepts no messages"}
        await self.send_json(refusal)

    async def run_events(self, message: GroupEvents) -> None:
        for event in message["events"]:
            await self.send_json(event)
