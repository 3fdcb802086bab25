"""Stragglers named live: when the rank named by the stored windows appears, changes or clears,
the run's row records it (one conditional update), its log gets one line, its page a
``straggler`` message and, where the owner asked, a notification (``signals.straggler_named``).

The supervisor flushes its sink through ``events_flush``: once a flush that stored windows of
several ranks' phases has committed, ``straggler_change`` reads the stored series, once per such
flush. Its change of the row (a conditional update that checks the row count, so a second writer
cannot say it twice), its line and its message then commit together, in a transaction of their
own: the line and the message go to the sink as ordinary events, numbered after that flush's,
stored, then sent. The sink itself only says what it stored (``PhasesStored``): it never reads
back what it wrote. A rank that stays named says nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from dashboard.experiments.core.messages import LogBody, StragglerBody
from dashboard.experiments.core.signals import straggler_named
from dashboard.experiments.metrics.breakdown import experiment_straggler
from dashboard.experiments.metrics.stragglers import (
    run_has_stages,
    straggler_cleared_text,
    straggler_context,
    straggler_text,
)
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.sink import EventSink


@dataclass(frozen=True)
class StragglerChange:
    """What to hand the sink after the flush: the page's message and the log's line."""

    message: StragglerBody
    log: LogBody


def _row_claim(*, experiment: Experiment, before: int | None, after: int | None, text: str) -> bool:
    """before -> after on the row, only if no other writer changed it first."""
    rows = Experiment.objects.filter(pk=experiment.pk)
    rows = (
        rows.filter(straggler_rank__isnull=True)
        if before is None
        else rows.filter(straggler_rank=before)
    )
    return rows.update(straggler_rank=after, straggler_text=text) == 1


def straggler_change(*, experiment: Experiment, step: int, time: float) -> StragglerChange | None:
    """The change since the rank the row last named (or none), recorded on the row; None when
    nothing changed (or another writer recorded it first)."""
    announced = (
        Experiment.objects.filter(pk=experiment.pk).values_list("straggler_rank", flat=True).first()
    )
    found = experiment_straggler(experiment=experiment, named=announced)
    rank = found["rank"] if found is not None else None
    if rank == announced:
        return None
    stages = run_has_stages(experiment)
    if found is None:
        text = straggler_cleared_text(rank=announced or 0, step=step, stages=stages)
    else:
        context = straggler_context(experiment=experiment, straggler=found)
        text = straggler_text(found, context=context)
    if not _row_claim(
        experiment=experiment, before=announced, after=rank, text="" if found is None else text
    ):
        return None
    message: StragglerBody = {
        "type": "straggler",
        "straggler": dict(found or {}) or None,
        "text": text,
    }
    # A pipeline's unbalanced split is no slow machine to be told of: said on the page alone.
    if found is not None and not stages:
        straggler_named.send(sender=Experiment, experiment_id=experiment.pk, text=text)
    level = "info" if found is None else "warning"
    return StragglerChange(
        message=message, log={"type": "log", "level": level, "message": text, "time": time}
    )


def events_flush(*, sink: EventSink) -> None:
    """Flush the sink; where the flush stored windows of several ranks' phases, look for the
    straggler in them now that they are committed, and flush what a change says at once: its
    log line, then its page message, numbered after the flush's own.

    The row's change, the line and the message commit together or not at all (the sink's flush
    is then a savepoint, and its send and the notification wait for the outer commit): where
    they roll back, the sink forgets the two, so that the next look says it once."""
    stored = sink.flush()
    if stored is None:
        return
    try:
        with transaction.atomic():
            change = straggler_change(
                experiment=sink.experiment, step=stored.step, time=stored.time
            )
            if change is None:
                return
            sink.add(change.log)
            sink.add(change.message)
            sink.flush()  # a log line and a message: no phases, so no second look
    except BaseException:
        sink.unflushed_drop()
        raise
