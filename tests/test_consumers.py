"""The live channel, driven through WebsocketCommunicator with the real ASGI application."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import transaction

from dashboard.experiments.models import LogLine, SeriesPoint
from dashboard.experiments.runs.broadcast import experiment_group
from dashboard.experiments.runs.sink import EventSink

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://localhost")


def application() -> Any:
    from dashboard.asgi import application

    return application


def communicator(pk: int, user: Any, *, origin: tuple[bytes, bytes] = ORIGIN) -> Any:
    comm = WebsocketCommunicator(application(), f"/ws/experiments/{pk}/", headers=[origin])
    # Put the user where AuthMiddlewareStack would; the session path is exercised end to end by
    # the integration tests.
    comm.scope["user"] = user
    return comm


async def test_snapshot_then_live_events_in_order(user_factory: Any, experiment_factory: Any):
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner, status="running", last_seq=1)
    await sync_to_async(SeriesPoint.objects.create)(
        experiment=run, key="train_loss", step=1, time=0.5, value=2.0
    )
    comm = communicator(run.pk, owner)
    connected, _ = await comm.connect()
    assert connected
    snapshot = await comm.receive_json_from()
    assert snapshot["type"] == "snapshot" and snapshot["experiment"]["id"] == run.pk
    assert [b[7] for b in snapshot["series"]["train_loss"]["buckets"]] == [2.0]

    sink = await sync_to_async(EventSink)(run)
    sink.add({"type": "step", "epoch": 1, "step": 10, "train_loss": 1.5, "time": 1.0})
    sink.add({"type": "log", "level": "info", "message": "hello"})
    await sync_to_async(sink.flush)()
    first, second = await comm.receive_json_from(), await comm.receive_json_from()
    assert (first["type"], second["type"]) == ("step", "log")
    assert second["seq"] == first["seq"] + 1 == snapshot["seq"] + 2
    await comm.disconnect()


async def test_one_group_message_per_flush(user_factory: Any, experiment_factory: Any):
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner, status="running")
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(experiment_group(run.pk), channel)
    sink = await sync_to_async(EventSink)(run)
    for step in range(1, 301):
        sink.add({"type": "step", "epoch": 1, "step": step, "train_loss": 1.0, "time": step})
    await sync_to_async(sink.flush)()
    message = await layer.receive(channel)
    assert len(message["events"]) == 300
    count = await sync_to_async(SeriesPoint.objects.filter(experiment=run).count)()
    assert count == 300


async def test_a_flush_is_sent_once_committed_and_never_when_rolled_back(
    user_factory: Any, experiment_factory: Any
):
    """A page that hears of an event finds it stored: a checkpoint's link, sent before the
    commit, answered 404 to a client that followed it at once."""
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner, status="running")
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(experiment_group(run.pk), channel)

    def flush_in_a_transaction(*, commit: bool) -> bool:
        """Whether the message had left before the transaction ended."""
        sink = EventSink(run)
        sink.add({"type": "log", "level": "info", "message": "stored first", "time": 1.0})
        with contextlib.suppress(RuntimeError), transaction.atomic():
            sink.flush()
            sent_early = async_to_sync(_received)(layer, channel) is not None
            if not commit:
                raise RuntimeError("rolled back")
        return sent_early

    assert await sync_to_async(flush_in_a_transaction)(commit=False) is False
    assert await _received(layer, channel) is None  # rolled back: nothing said
    assert await sync_to_async(flush_in_a_transaction)(commit=True) is False
    message = await _received(layer, channel)  # committed: said once
    assert message is not None and message["events"][0]["message"] == "stored first"
    lines = await sync_to_async(LogLine.objects.filter(experiment=run).count)()
    assert lines == 1


async def _received(layer: Any, channel: str) -> dict[str, Any] | None:
    with contextlib.suppress(TimeoutError):
        return dict(await asyncio.wait_for(layer.receive(channel), 0.3))
    return None


@pytest.mark.parametrize("who", ["anonymous", "stranger"])
async def test_refused_for_anonymous_and_other_users(
    user_factory: Any, experiment_factory: Any, who: str
):
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner)
    user = AnonymousUser() if who == "anonymous" else await sync_to_async(user_factory)()
    connected, _ = await communicator(run.pk, user).connect()
    assert not connected


async def test_staff_may_watch_any_run(user_factory: Any, experiment_factory: Any):
    owner = await sync_to_async(user_factory)()
    staff = await sync_to_async(user_factory)(staff=True)
    run = await sync_to_async(experiment_factory)(owner=owner)
    comm = communicator(run.pk, staff)
    connected, _ = await comm.connect()
    assert connected and (await comm.receive_json_from())["type"] == "snapshot"
    await comm.disconnect()


async def test_foreign_origin_is_refused(user_factory: Any, experiment_factory: Any):
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner)
    comm = communicator(run.pk, owner, origin=(b"origin", b"http://evil.example"))
    connected, _ = await comm.connect()
    assert not connected


async def test_client_messages_are_answered_not_acted_on(
    user_factory: Any, experiment_factory: Any
):
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner)
    comm = communicator(run.pk, owner)
    await comm.connect()
    await comm.receive_json_from()
    await comm.send_to(text_data="{not json")
    assert (await comm.receive_json_from())["type"] == "error"
    await comm.disconnect()


async def test_a_queued_run_stopped_tells_every_open_page(
    user_factory: Any, experiment_factory: Any
):
    """A Stop cancels a queued run at once (no supervisor to tell the page later): another page
    open on that run hears the end too, without reconnecting."""
    from dashboard.experiments.services import experiment_stop

    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner, status="queued")
    comm = communicator(run.pk, owner)
    connected, _ = await comm.connect()
    assert connected
    snapshot = await comm.receive_json_from()
    assert await sync_to_async(experiment_stop)(experiment=run, by=owner)
    message = await comm.receive_json_from(timeout=2)
    assert (message["type"], message["status"]) == ("failed", "cancelled")
    assert message["error"] == f"Stopped by {owner} before it started."
    assert message["seq"] == snapshot["seq"] + 1
    await comm.disconnect()
