"""Where a run's events go: metric and log rows in the database, then the run's channel group.

Events are numbered by the dashboard (`seq`, per experiment, no gaps), stored in one transaction
per flush, and sent as one channel message per flush: channels-redis drops messages past its
capacity without a word, so a fast run must not send one message per event. What it takes (a
training event, or a body of the dashboard's own) and what the page receives are typed in
`messages.py`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any, ClassVar, cast

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from dashboard.experiments.messages import (
    GROUP_MESSAGE_TYPE,
    Body,
    GroupEvents,
    LogBody,
    Message,
    RankRow,
    RankStats,
)
from dashboard.experiments.models import Checkpoint, Experiment, LogLine, MetricPoint
from dashboard.experiments.run_facts import checkpoint_texts, rank_rows, started_texts
from training.protocol import Event

log = logging.getLogger(__name__)

POINT_FIELDS = ("step", "epoch", "train_loss", "test_loss", "test_accuracy", "images_per_second")
MAX_LOG_CHARS = 4000
RANK_FIELDS = ("images_per_second", "data_seconds", "compute_seconds", "rss_bytes")
# A report is trusted to be small, not to be well-formed: bound what one event can store.
MAX_RANKS = 1024
MAX_PATH_CHARS = 4096


def experiment_group(experiment_id: int) -> str:
    return f"experiment-{experiment_id}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def rank_stats_from_event(message: dict[str, Any]) -> RankStats | None:
    """The per-rank figures of a step or epoch event (protocol 1.1), or None when it has none.

    Events from one-process strategies may carry rank 0's figures only (data_seconds, ...)
    without `ranks`: those become a one-rank list, so the page has one shape to draw.
    """
    ranks = message.get("ranks")
    if not isinstance(ranks, list):
        if all(_number(message.get(name)) is None for name in RANK_FIELDS[1:]):
            return None
        ranks = [{"rank": 0, **{name: message.get(name) for name in RANK_FIELDS}}]
    rows: list[RankRow] = []
    for index, rank in enumerate(ranks[:MAX_RANKS]):
        if not isinstance(rank, dict):
            continue
        number = rank.get("rank")
        if not isinstance(number, int) or isinstance(number, bool):
            number = index
        figures = {name: _number(rank.get(name)) for name in RANK_FIELDS}
        rows.append(cast(RankRow, {"rank": number, **figures}))
    if not rows:
        return None
    return {
        "type": message["type"],
        "step": message.get("step"),
        "epoch": message.get("epoch"),
        "time": _number(message.get("time")),
        "ranks": rows,
    }


def file_size(path: str) -> int | None:
    # Read here, by the worker: the file is on this machine, maybe not on the web server's.
    try:
        return os.stat(path).st_size
    except (OSError, ValueError):
        return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def checkpoint_saved_text(message: dict[str, Any]) -> str:
    if message.get("requested") is True:
        return (
            f"checkpoint saved on request at step {message.get('step')} "
            f"(epoch {message.get('epoch')})"
        )
    return f"checkpoint of epoch {message.get('epoch')} saved"


class EventSink:
    def __init__(self, experiment: Experiment):
        self.experiment = experiment
        self.seq = experiment.last_seq
        self.points: list[MetricPoint] = []
        self.logs: list[LogLine] = []
        self.messages: list[dict[str, Any]] = []
        self.updates: dict[str, Any] = {}
        self.checkpoints: list[Checkpoint] = []
        self.pruned: set[int] = set()
        self.channel_layer = get_channel_layer()

    def add(self, event: Event | Body) -> Message:
        """Number an event, queue its rows and its message; returns the message."""
        self.seq += 1
        # A report is trusted to be small, not to be well-formed: the handlers read it as a dict.
        message: dict[str, Any] = {**event, "seq": self.seq}
        for envelope in ("v", "minor", "run"):  # the training's, not the page's
            message.pop(envelope, None)
        store = self.STORE.get(message["type"])
        if store is not None:
            store(self, message)
        self.messages.append(message)
        return cast(Message, message)

    def add_output(self, line: str, *, level: str) -> None:
        """A line of plain output (stderr, or stdout that is not an event)."""
        body: LogBody = {"type": "log", "level": level, "message": line.rstrip()[:MAX_LOG_CHARS]}
        self.add(body)

    def _started_store(self, message: dict[str, Any]) -> None:
        self.updates.update(
            run_info={k: v for k, v in message.items() if k not in {"seq", "type"}},
            notes=list(message.get("notes") or []),
            total_steps=message.get("total_steps"),
        )
        for note in message.get("notes") or []:
            self._add_log({"seq": self.seq, "time": message.get("time"), "message": note})
        message["texts"] = started_texts(message)

    def _log_store(self, message: dict[str, Any]) -> None:
        self._add_log(message, level=str(message.get("level", "info")))

    def _checkpoint_store(self, message: dict[str, Any]) -> None:
        self._add_checkpoint(message)
        # The page appends the same line live: the words are written here only.
        message["log_text"] = checkpoint_saved_text(message)
        self._add_log({**message, "message": message["log_text"]})
        message["texts"] = checkpoint_texts(message)

    def _failed_store(self, message: dict[str, Any]) -> None:
        if message.get("traceback"):
            self._add_log({**message, "message": message["traceback"]}, level="error")

    def _add_point(self, message: dict[str, Any]) -> None:
        values = {name: _number(message.get(name)) for name in POINT_FIELDS}
        if message["type"] == "epoch":
            values["train_loss"] = None  # the epoch mean would draw a second, coarser curve
        else:
            values["test_loss"] = values["test_accuracy"] = None
        step, epoch = int(values.pop("step") or 0), int(values.pop("epoch") or 0)
        self.points.append(
            MetricPoint(
                experiment_id=self.experiment.pk,
                seq=self.seq,
                step=step,
                epoch=epoch,
                time=_number(message.get("time")) or 0.0,
                **values,
            )
        )
        self.updates.update(step=step, epoch=epoch)
        stats = rank_stats_from_event(message)
        if stats is not None:
            self.updates["rank_stats"] = stats
            message["texts"] = {"ranks": rank_rows(stats)}  # the page places them as they are

    def _add_checkpoint(self, message: dict[str, Any]) -> None:
        epoch, step, path = message.get("epoch"), message.get("step"), message.get("path")
        if not (_count(epoch) and isinstance(step, int) and _count(step)):
            return
        if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
            return
        checkpoint = Checkpoint(
            experiment_id=self.experiment.pk,
            epoch=epoch,
            step=step,
            requested=message.get("requested") is True,
            path=path,
            size=file_size(path),
            worker=self.experiment.worker,
        )
        self.pruned.discard(step)
        self.checkpoints = [c for c in self.checkpoints if c.step != step]
        self.checkpoints.append(checkpoint)
        gone = self._checkpoints_gone(keep_step=step)
        # The message tells the page where to download it (the size is what the worker saw) and
        # which older ones the training's retention has deleted (by step).
        message.update(size=checkpoint.size, url=checkpoint.get_absolute_url(), pruned=gone)

    def _checkpoints_gone(self, *, keep_step: int) -> list[int]:
        """Steps whose files this worker wrote and no longer has (the training keeps the last
        few); their rows go, so that the list shows what can still be fetched."""
        stored = Checkpoint.objects.filter(
            experiment_id=self.experiment.pk, worker=self.experiment.worker
        ).values_list("step", "path")
        entries = [*stored, *((c.step, c.path) for c in self.checkpoints)]
        present = {step for step, path in entries if file_size(path) is not None}
        # A step written again (a resumed attempt) counts as present if any copy is.
        gone = sorted({step for step, _ in entries} - present - {keep_step})
        self.pruned.update(gone)
        self.checkpoints = [c for c in self.checkpoints if c.step not in self.pruned]
        return gone

    def _add_log(self, message: dict[str, Any], *, level: str = "info") -> None:
        self.logs.append(
            LogLine(
                experiment_id=self.experiment.pk,
                seq=self.seq,
                time=_number(message.get("time")) or 0.0,
                level=level[:16],
                message=str(message.get("message", ""))[:MAX_LOG_CHARS],
            )
        )

    def flush(self) -> None:
        """Store what was added, then send it. The database comes first: it is the record."""
        if not self.messages:
            return
        with transaction.atomic():
            MetricPoint.objects.bulk_create(self.points)
            LogLine.objects.bulk_create(self.logs)
            if self.pruned:
                Checkpoint.objects.filter(
                    experiment_id=self.experiment.pk, step__in=self.pruned
                ).delete()
            # A resumed run writes its steps' checkpoints again: the newer file wins.
            Checkpoint.objects.bulk_create(
                # One row per step per statement: PostgreSQL refuses to update a row twice.
                list({c.step: c for c in self.checkpoints}.values()),
                update_conflicts=True,
                unique_fields=["experiment", "step"],
                update_fields=["epoch", "requested", "path", "size", "worker", "created"],
            )
            Experiment.objects.filter(pk=self.experiment.pk).update(
                last_seq=self.seq, **self.updates
            )
        messages, self.messages = self.messages, []
        self.points, self.logs, self.updates, self.checkpoints = [], [], {}, []
        self.pruned = set()
        self._send(messages)

    def _send(self, messages: list[dict[str, Any]]) -> None:
        if self.channel_layer is None:
            return
        group_message: GroupEvents = {
            "type": GROUP_MESSAGE_TYPE,
            "events": cast(list[Message], messages),
        }
        try:
            async_to_sync(self.channel_layer.group_send)(
                experiment_group(self.experiment.pk), group_message
            )
        except Exception:  # the browser backfills from the database on reconnect
            log.warning("channel layer unreachable; %d events only stored", len(messages))

    # What each type stores besides its message (one entry per type; a type not here, such as
    # status or finished, is only sent).
    STORE: ClassVar[dict[str, Callable[[EventSink, dict[str, Any]], None]]] = {
        "started": _started_store,
        "step": _add_point,
        "epoch": _add_point,
        "log": _log_store,
        "checkpoint": _checkpoint_store,
        "failed": _failed_store,
    }
