"""Every change of a run's status together with what it tells: one function per change.

The conditional update and the `run_ended` signal are core/transitions.py's; the page message is
the sink's (the channel send lives in runs/). Each function here does both, zulip's way (the
function that writes also notifies), so no caller can move a run and forget its open pages. Each
returns what its transition returned: False means another process got there first, and the
page is told nothing the database does not hold.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.utils import timezone

from dashboard.experiments.core import transitions
from dashboard.experiments.core.messages import RunFailedBody, RunFinishedBody
from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.attempts import attempts_with_current
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.stragglers import events_flush

log = logging.getLogger(__name__)


def run_lose(
    *, experiment: Experiment, sink: EventSink, reason: str, history: list[dict[str, Any]],
    node_silent: bool = False,
) -> bool:  # fmt: skip
    """running -> lost (the reaper: no heartbeat, or one machine of several fell silent)."""
    if not transitions.experiment_lose(
        experiment=experiment, reason=reason, history=history, node_silent=node_silent
    ):
        return False
    sink.add({"type": "status", "status": Status.LOST, "reason": reason})
    sink.flush()
    return True


def run_requeue(*, sink: EventSink, waiting_reason: str, now: datetime) -> bool:
    """lost -> queued, for another attempt; the caller sends it to a worker."""
    experiment_id = sink.experiment.pk
    if not transitions.experiment_requeue(
        experiment_id=experiment_id, waiting_reason=waiting_reason, now=now
    ):
        return False
    sink.add({"type": "status", "status": Status.QUEUED, "reason": waiting_reason})
    sink.flush()
    return True


def run_restart(*, experiment: Experiment, sink: EventSink, outcome: Outcome) -> bool:
    """running -> queued: the attempt ended by a Stop and resume (``outcome``, cancelled, says
    who asked); the caller sends the run to a worker, whose attempt resumes from the newest
    checkpoint. False when the run had moved on."""
    now = timezone.now()
    history = attempts_with_current(
        experiment=experiment, outcome=outcome.status, reason=outcome.error, ended_at=now
    )
    waiting = f"attempt {experiment.attempt} stopped to resume from its last checkpoint"
    if not transitions.experiment_restart(
        experiment=experiment, history=history, waiting_reason=waiting, now=now
    ):
        events_flush(sink=sink)
        return False
    sink.add({"type": "status", "status": Status.QUEUED, "reason": waiting})
    events_flush(sink=sink)
    return True


def run_give_up(*, sink: EventSink, error: str, now: datetime) -> bool:
    """lost -> failed, its attempts used up."""
    if not transitions.experiment_give_up(experiment_id=sink.experiment.pk, error=error, now=now):
        return False
    sink.add(run_end_body(Outcome(Status.FAILED, error=error)))
    sink.flush()
    return True


def run_cancel_queued(
    *, experiment: Experiment, by: Any, error: str, now: datetime,
    where: dict[str, Any] | None = None,
) -> bool:  # fmt: skip
    """queued -> cancelled, by a Stop before any worker started it (`where`: and while the row
    still holds these values). No supervisor will ever tell this run's pages, so the message
    goes here."""
    if not transitions.experiment_cancel_queued(
        experiment_id=experiment.pk, by=by, error=error, now=now, where=where
    ):
        return False
    sink = EventSink(experiment)
    sink.add(run_end_body(Outcome(Status.CANCELLED, error=error)))
    sink.flush()
    return True


def run_refuse(*, experiment: Experiment, error: str, where: dict[str, Any] | None = None) -> bool:
    """queued -> failed: the scheduler refused the run's job (runs/slurm/submit.py), or it ended
    before it started the run (`where`: while the row still holds these values, its job's id).
    No supervisor will ever tell this run's pages, so the message goes here."""
    if not transitions.experiment_refuse(
        experiment_id=experiment.pk, error=error, now=timezone.now(), where=where
    ):
        return False
    sink = EventSink(experiment)
    sink.add(run_end_body(Outcome(Status.FAILED, error=error)))
    sink.flush()
    return True


def run_finish(*, experiment: Experiment, sink: EventSink, outcome: Outcome) -> bool:
    """running -> succeeded / failed / cancelled (a Stop ends here too): the attempt's end as its
    supervisor saw it. False when the run had moved on (its page hears nothing)."""
    finished_at = timezone.now()
    history = attempts_with_current(
        experiment=experiment, outcome=outcome.status, reason=outcome.error, ended_at=finished_at
    )
    settled = transitions.experiment_finish(
        experiment=experiment, outcome=outcome, history=history, finished_at=finished_at
    )
    if not settled:
        # The reaper gave this attempt up in the moment it ended; the run is the next one's, so
        # the page must not be told an end the database does not hold.
        log.warning(
            "experiment %s moved on before attempt %s settled", experiment.pk, experiment.attempt
        )
        events_flush(sink=sink)
        return False
    sink.add(run_end_body(outcome))
    # The supervisor's sink: steps it could not flush (its loop failed) may name a straggler.
    events_flush(sink=sink)
    return True


def run_end_body(outcome: Outcome) -> RunFinishedBody | RunFailedBody:
    """The page's finished or failed message: the final status is the dashboard's to say."""
    if outcome.status == Status.SUCCEEDED:
        return {
            "type": "finished",
            "status": outcome.status,
            "test_loss": outcome.test_loss,
            "test_accuracy": outcome.test_accuracy,
        }
    return {"type": "failed", "status": outcome.status, "error": outcome.error}
