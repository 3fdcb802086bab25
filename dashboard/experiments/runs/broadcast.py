"""The run's pages hear of its events here: the channel group of a run, and the one message a
flush sends to it (channels-redis drops messages past its capacity, so never one per event)."""

from __future__ import annotations

import logging
from typing import Any, cast

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer

from dashboard.experiments.core.messages import GROUP_MESSAGE_TYPE, GroupEvents, Message

log = logging.getLogger(__name__)


def experiment_group(experiment_id: int) -> str:
    return f"experiment-{experiment_id}"


def events_broadcast(
    *, channel_layer: BaseChannelLayer | None, experiment_id: int, messages: list[dict[str, Any]]
) -> None:
    """Send one flush's messages to the run's pages; a page that misses them backfills from the
    database when it reconnects, so an unreachable layer only logs."""
    if channel_layer is None:
        return
    group_message: GroupEvents = {
        "type": GROUP_MESSAGE_TYPE,
        "events": cast(list[Message], messages),
    }
    try:
        async_to_sync(channel_layer.group_send)(experiment_group(experiment_id), group_message)
    except Exception:
        log.warning("channel layer unreachable; %d events only stored", len(messages))


def checkpoint_saved_text(message: dict[str, Any]) -> str:
    """The log line of a checkpoint event (the page appends the same line live)."""
    if message.get("requested") is True:
        return (
            f"checkpoint saved on request at step {message.get('step')} "
            f"(epoch {message.get('epoch')})"
        )
    return f"checkpoint of epoch {message.get('epoch')} saved"
