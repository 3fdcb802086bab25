"""A run's attempts: the record each one leaves, and where the next one resumes from.

A run that outlives its worker is queued again (see survival.py) and its next attempt resumes
from the newest checkpoint it can read. Each attempt that ends, however it ends, adds one record
to `Experiment.attempts`, which the error of a run that gave up lists.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from dashboard.experiments.core.checkpoints import checkpoint_file_resolve
from dashboard.experiments.metrics.series import series_delete_after
from dashboard.experiments.models import Checkpoint, Experiment

log = logging.getLogger(__name__)


def attempt_record(
    *, experiment: Experiment, outcome: str, reason: str, ended_at: datetime
) -> dict[str, Any]:
    return {
        "attempt": experiment.attempt,
        "worker": experiment.worker,
        "ended_at": ended_at.isoformat(),
        "outcome": outcome,
        "reason": reason[:500],
    }


def attempts_with_current(
    *, experiment: Experiment, outcome: str, reason: str, ended_at: datetime
) -> list[dict[str, Any]]:
    """The run's attempt history with the current attempt's end added (a new list)."""
    ended = attempt_record(experiment=experiment, outcome=outcome, reason=reason, ended_at=ended_at)
    return [*experiment.attempts, ended]


def attempts_summary(history: list[dict[str, Any]]) -> str:
    """Why a run gave up, one line an attempt."""
    lines = [f"attempt {a['attempt']} on {a['worker']}: {a['outcome']}, {a['reason']}"
             for a in history]  # fmt: skip
    return f"gave up after {len(history)} attempts:\n" + "\n".join(lines)


def checkpoint_latest(*, experiment_id: int) -> Checkpoint | None:
    """The newest checkpoint the run reported whose file this worker can read: end of epoch or
    requested mid-epoch, the training resumes either exactly."""
    for checkpoint in Checkpoint.objects.filter(experiment_id=experiment_id).order_by("-step"):
        # Only from inside the run's own folder, as for downloads.
        if checkpoint_file_resolve(checkpoint=checkpoint, folder_ok=True) is not None:
            return checkpoint
    return None


def experiment_resume_prepare(*, experiment: Experiment) -> Path | None:
    """On a later attempt: the checkpoint to resume from, with the points after it removed.

    The resumed training replays every step after the checkpoint; its points replace the old
    ones instead of being added twice, and the run's step goes back to the checkpoint's.
    """
    if experiment.attempt <= 1:
        return None
    latest = checkpoint_latest(experiment_id=experiment.pk)
    kept_steps = latest.step if latest else 0
    # An epoch's test point carries the epoch's last step: kept when the checkpoint is at or
    # after the epoch's end, replaced when it was taken mid-epoch.
    removed = series_delete_after(experiment=experiment, step=kept_steps)
    # The run is back at the checkpoint's step: machine samples taken before the training
    # reports a step are placed there (EventSink.step), not at the old attempt's last step.
    Experiment.objects.filter(pk=experiment.pk).update(step=kept_steps)
    experiment.step = kept_steps
    log.info(
        "experiment %s attempt %s: resuming after step %s (%s points replaced)",
        experiment.pk,
        experiment.attempt,
        kept_steps,
        removed,
    )
    return Path(latest.path) if latest else None
