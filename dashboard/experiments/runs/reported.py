"""Runs reported from outside: a script on another machine creates its run and posts its ranks'
events (trainyard/report.py, the client); here they are stored once each and the run settled.

No worker runs such a run: it is created `running` (never queued, so never claimed), with no
heartbeat and no placement, so the reaper and the placement leave it alone. Its events go
through the same EventSink as a launched run's, so its series, logs and the pages' live
messages are the same; its end goes through lifecycle.run_finish, a conditional transition
that owns its side effects (the page's message, the `run_ended` signal).

Idempotence. Each rank numbers its events (`seq`, 1, 2, 3, ...) and its client sends them in
that order, resending from after what the server acknowledged. So one high-water mark per
(run, attempt, rank) (`ReportedMark`) tells a new event from one already stored: a retry of a
post whose answer was lost, or a second `trainyard sync` of the same spool, stores nothing
twice. A mark is a row per rank rather than a row per event (a unique table of every event
would grow as the series do), and it moves by a conditional update under its row lock, in the
transaction that stores the events: two posts of the same events at once store them once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboard.experiments.core.reported import ReportedEvent, reported_silent_seconds
from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Experiment, ReportedMark, Status
from dashboard.experiments.runs.lifecycle import run_finish
from dashboard.experiments.runs.sink import MAX_LOG_CHARS, EventSink, output_body
from training.protocol import Event

SCRIPT = "script"  # training/registry.py's strategy of a user's own script
REPORTED_NOTE = (
    "Reported from outside: a script run elsewhere sends its events here (trainyard.init with "
    "a server). No worker runs it; a Stop asks the script, whose ranks agree on it."
)


class MarkMoved(Exception):
    """Another post of this run's events moved a rank's mark meanwhile: read it again."""


@dataclass(frozen=True)
class ReportAnswer:
    """What a post of events is answered: what was stored, what was already, and the requests
    the script's ranks agree on (`checkpoint`: the pending request's number, 0 for none)."""

    stored: int
    duplicates: int
    stop: bool
    checkpoint: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "stored": self.stored, "duplicates": self.duplicates,
            "stop": self.stop, "checkpoint": self.checkpoint,
        }  # fmt: skip


def reported_run_create(
    *, owner: Any, key: str, name: str, processes: int
) -> tuple[Experiment, bool]:
    """The owner's run of this key, created running if it is new; True if it was created. Every
    rank of a script, and a later `trainyard sync`, asks with the same key and gets one run."""
    found = Experiment.objects.filter(owner=owner, report_key=key).first()
    if found is not None:
        return found, False
    now = timezone.now()
    try:
        with transaction.atomic():
            experiment = Experiment.objects.create(
                owner=owner, name=name, strategy=SCRIPT, processes=processes, nodes=1,
                status=Status.RUNNING, started_at=now, attempt=1, reported=True,
                report_key=key, last_heard_at=now, notes=[REPORTED_NOTE],
            )  # fmt: skip
    except IntegrityError:  # another rank's request created it in the meantime
        return Experiment.objects.get(owner=owner, report_key=key), False
    return experiment, True


def reported_events_store(*, experiment: Experiment, events: list[ReportedEvent]) -> ReportAnswer:
    """Store the events not stored yet, settle the run if they end it, and answer."""
    try:
        stored = _store_once(experiment=experiment, events=events)
    except MarkMoved:  # rolled back whole: the second reading sees the other post's marks
        stored = _store_once(experiment=experiment, events=events)
    return _answer(experiment_id=experiment.pk, stored=stored, duplicates=len(events) - stored)


def _store_once(*, experiment: Experiment, events: list[ReportedEvent]) -> int:
    with transaction.atomic():
        fresh = _marks_advance(experiment=experiment, events=events)
        experiment = Experiment.objects.get(pk=experiment.pk)  # the sink numbers from its row
        sink = EventSink(experiment)
        for event in fresh:
            EVENT_TAKES.get(event.type, _nothing)(sink, event)
        sink.flush()
        Experiment.objects.filter(pk=experiment.pk).update(last_heard_at=timezone.now())
        outcome = _ending(experiment=experiment, events=fresh)
        if outcome is not None:
            experiment.refresh_from_db()
            run_finish(experiment=experiment, sink=sink, outcome=outcome)
        if any(e.type == "checkpoint" and e.rank == 0 and e.fields.get("answers_request") is True
               for e in fresh):  # fmt: skip
            Experiment.objects.filter(pk=experiment.pk).update(
                checkpoint_requested_at=None, checkpoint_requested_by=None
            )
    return len(fresh)


def _marks_advance(*, experiment: Experiment, events: list[ReportedEvent]) -> list[ReportedEvent]:
    """The events above their rank's mark, the marks moved past them (the caller's
    transaction holds their rows locked until it commits)."""
    ranks = sorted({event.rank for event in events})
    ReportedMark.objects.bulk_create(
        [ReportedMark(experiment=experiment, attempt=experiment.attempt, rank=r) for r in ranks],
        ignore_conflicts=True,
    )
    marks = dict(
        ReportedMark.objects.select_for_update()
        .filter(experiment=experiment, attempt=experiment.attempt, rank__in=ranks)
        .values_list("rank", "seq")
    )
    fresh = [event for event in events if event.seq > marks[event.rank]]
    for rank in {event.rank for event in fresh}:
        top = max(event.seq for event in fresh if event.rank == rank)
        moved = ReportedMark.objects.filter(
            experiment=experiment, attempt=experiment.attempt, rank=rank, seq=marks[rank]
        ).update(seq=top)
        if moved != 1:
            raise MarkMoved
    return fresh


def _ending(*, experiment: Experiment, events: list[ReportedEvent]) -> Outcome | None:
    """How these events end the run, if they do: any rank's failure, else rank 0's `done`."""
    for event in events:
        if event.type == "failed":
            error = str(event.fields.get("error") or "the script failed")
            return Outcome(Status.FAILED, error=f"rank {event.rank}: {error}")
    if not any(e.type == "done" and e.rank == 0 for e in events):
        return None
    stopped = next(e for e in events if e.type == "done" and e.rank == 0).fields.get("stopped")
    if stopped is True and experiment.cancel_requested_at is not None:
        by = experiment.cancelled_by
        return Outcome(Status.CANCELLED, error=f"Stopped by {by or 'a user'}.")
    return Outcome(Status.SUCCEEDED)


def _answer(*, experiment_id: int, stored: int, duplicates: int) -> ReportAnswer:
    fields = ("status", "cancel_requested_at", "checkpoint_requested_at")
    row = Experiment.objects.values(*fields).get(pk=experiment_id)
    running = row["status"] == Status.RUNNING
    asked: datetime | None = row["checkpoint_requested_at"]
    return ReportAnswer(
        stored=stored,
        duplicates=duplicates,
        stop=running and row["cancel_requested_at"] is not None,
        # A number that grows with each request, as the launcher's count does (trainyard/run.py
        # agrees on the largest and answers each one once).
        checkpoint=int(asked.timestamp() * 1000) if running and asked is not None else 0,
    )


def reported_run_stop_silent(*, experiment: Experiment, by: Any) -> bool:
    """End a silent run reported from outside at once (cancelled): no script is there to hear
    a Stop. False for any other run (its Stop is asked of whoever runs it)."""
    if reported_silent_seconds(experiment=experiment, now=timezone.now()) is None:
        return False
    with transaction.atomic():
        Experiment.objects.filter(pk=experiment.pk, status=Status.RUNNING).update(
            cancel_requested_at=timezone.now(), cancelled_by=by
        )
        outcome = Outcome(Status.CANCELLED, error=f"Stopped by {by} while not heard from.")
        return run_finish(experiment=experiment, sink=EventSink(experiment), outcome=outcome)


# ---- what each type stores (one entry per type; the launcher-only ones store nothing) ----


def _nothing(sink: EventSink, event: ReportedEvent) -> None:
    return None


def _metrics_take(sink: EventSink, event: ReportedEvent) -> None:
    fields = event.fields
    metrics = {"type": "metrics", "step": fields["step"], "rank": event.rank,
               "values": fields["values"], "time": event.time}  # fmt: skip
    sink.add(cast(Event, metrics))


def _line_add(sink: EventSink, text: str, *, level: str, event: ReportedEvent) -> None:
    body = output_body(text, level=level, rank=event.rank)
    body["time"] = event.time  # the rank's clock, as its launched twin's lines carry
    sink.add(body)


def _log_take(sink: EventSink, event: ReportedEvent) -> None:
    level = str(event.fields.get("level", "info"))
    _line_add(sink, str(event.fields["message"]), level=level, event=event)


def _checkpoint_take(sink: EventSink, event: ReportedEvent) -> None:
    # The file is on the script's machine, not this server's: a line of the log, never a row
    # the page would offer to download.
    fields = event.fields
    line = (
        f"checkpoint saved at step {fields['step']} on the script's own machine: "
        f"{fields['path']} (not kept here)"
    )
    _line_add(sink, line, level="info", event=event)


def _failed_take(sink: EventSink, event: ReportedEvent) -> None:
    # The end of a traceback is what says what went wrong: kept where the line is cut.
    text = str(event.fields.get("traceback") or event.fields.get("error") or "")[-MAX_LOG_CHARS:]
    if text:
        _line_add(sink, text, level="error", event=event)


EVENT_TAKES = {
    "metrics": _metrics_take,
    "log": _log_take,
    "checkpoint": _checkpoint_take,
    "failed": _failed_take,
}
