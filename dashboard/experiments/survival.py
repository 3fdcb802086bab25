"""Runs that outlive their workers: heartbeats, the reaper, resume from checkpoints, orphans.

Delivery is early-acknowledged (CELERY_TASK_ACKS_LATE=False): a broker never redelivers a
long run by itself (Redis' visibility timeout would start a second copy after an hour). Instead
the supervising task writes a heartbeat, and the reaper (Celery beat) marks a run whose heartbeat
stopped as `lost` and queues it again, to resume from its last checkpoint.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboard.experiments.checkpoints import checkpoint_file_resolve
from dashboard.experiments.models import Checkpoint, Experiment, MetricPoint, Status
from dashboard.experiments.processes import process_tree_stop
from dashboard.experiments.sink import EventSink

log = logging.getLogger(__name__)


def supervisor_started() -> float:
    return psutil.Process(os.getpid()).create_time()


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


def checkpoint_latest(*, experiment_id: int) -> Checkpoint | None:
    """The newest checkpoint the run reported whose file this worker can read: end of epoch or
    requested mid-epoch, the training resumes either exactly."""
    for checkpoint in Checkpoint.objects.filter(experiment_id=experiment_id).order_by("-step"):
        # Only from inside the run's own folder, as for downloads.
        if checkpoint_file_resolve(checkpoint=checkpoint) is not None:
            return checkpoint
    return None


def experiment_resume_prepare(*, experiment: Experiment) -> Path | None:
    """On a later attempt: the checkpoint to resume from, with the points after it removed.

    The resumed training replays every step after the checkpoint; its points replace the old
    ones instead of being added twice.
    """
    if experiment.attempt <= 1:
        return None
    latest = checkpoint_latest(experiment_id=experiment.pk)
    kept_steps = latest.step if latest else 0
    # An epoch's test point carries the epoch's last step: kept when the checkpoint is at or
    # after the epoch's end, replaced when it was taken mid-epoch.
    removed, _ = MetricPoint.objects.filter(experiment=experiment, step__gt=kept_steps).delete()
    log.info(
        "experiment %s attempt %s: resuming after step %s (%s points replaced)",
        experiment.pk,
        experiment.attempt,
        kept_steps,
        removed,
    )
    return Path(latest.path) if latest else None


def experiments_reap_lost(*, now: datetime | None = None) -> list[int]:
    """Mark runs whose heartbeat stopped as lost; queue them again while attempts remain."""
    now = now or timezone.now()
    bound = timedelta(seconds=settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS)
    reaped = []
    stale = Experiment.objects.filter(status=Status.RUNNING, heartbeat_at__lt=now - bound)
    for experiment in stale:
        if experiment_mark_lost(experiment=experiment, now=now):
            reaped.append(experiment.pk)
    return reaped


def experiment_mark_lost(*, experiment: Experiment, now: datetime) -> bool:
    assert experiment.heartbeat_at is not None
    silent = (now - experiment.heartbeat_at).total_seconds()
    reason = f"no heartbeat from worker {experiment.worker} for {silent:.0f} s"
    history = [*experiment.attempts, attempt_record(
        experiment=experiment, outcome=Status.LOST, reason=reason, ended_at=now
    )]  # fmt: skip
    retry = experiment.attempt < settings.TRAINYARD_MAX_ATTEMPTS
    with transaction.atomic():
        marked = Experiment.objects.filter(
            pk=experiment.pk, status=Status.RUNNING, heartbeat_at=experiment.heartbeat_at
        ).update(
            status=Status.LOST,
            error=reason,
            attempts=history,
            launcher_pid=None,
            # Asked of the attempt that was lost; the next one starts from the newest checkpoint.
            checkpoint_requested_at=None,
            checkpoint_requested_by=None,
        )
        if not marked:
            return False
    log.warning("experiment %s lost: %s", experiment.pk, reason)
    experiment.refresh_from_db()
    sink = EventSink(experiment)
    sink.add({"type": "status", "status": Status.LOST, "reason": reason})
    sink.flush()
    if retry:
        experiment_requeue(experiment=experiment, sink=sink, reason=reason)
    else:
        experiment_fail_lost(experiment=experiment, sink=sink, history=history)
    return True


def experiment_requeue(*, experiment: Experiment, sink: EventSink, reason: str) -> None:
    from dashboard.experiments.tasks import run_experiment

    waiting = f"attempt {experiment.attempt} lost ({reason}); queued to resume"
    with transaction.atomic():
        queued = Experiment.objects.filter(pk=experiment.pk, status=Status.LOST).update(
            status=Status.QUEUED, waiting_reason=waiting[:300], heartbeat_at=timezone.now()
        )
        if queued:
            transaction.on_commit(lambda: run_experiment.delay(experiment.pk))
    if queued:
        sink.add({"type": "status", "status": Status.QUEUED, "reason": waiting})
        sink.flush()


def experiment_fail_lost(
    *, experiment: Experiment, sink: EventSink, history: list[dict[str, Any]]
) -> None:
    lines = [f"attempt {a['attempt']} on {a['worker']}: {a['outcome']}, {a['reason']}"
             for a in history]  # fmt: skip
    error = f"gave up after {len(history)} attempts:\n" + "\n".join(lines)
    failed = Experiment.objects.filter(pk=experiment.pk, status=Status.LOST).update(
        status=Status.FAILED, error=error, finished_at=timezone.now()
    )
    if failed:
        sink.add({"type": "failed", "status": Status.FAILED, "error": error})
        sink.flush()


def experiments_redispatch_queued(*, now: datetime | None = None) -> list[int]:
    """Send queued runs again whose task message may have been lost (a Redis restart without
    persistence). A duplicate is harmless: only one claim of a queued run can succeed."""
    from dashboard.experiments.tasks import run_experiment

    now = now or timezone.now()
    bound = now - timedelta(seconds=settings.TRAINYARD_REDISPATCH_SECONDS)
    stale = Experiment.objects.filter(status=Status.QUEUED, heartbeat_at__lt=bound)
    stale = stale | Experiment.objects.filter(
        status=Status.QUEUED, heartbeat_at=None, created_at__lt=bound
    )
    sent = []
    for experiment in stale:
        if Experiment.objects.filter(pk=experiment.pk, status=Status.QUEUED).update(
            heartbeat_at=now
        ):
            run_experiment.delay(experiment.pk)
            sent.append(experiment.pk)
    return sent


def training_orphans_end() -> list[int]:
    """End training processes on this machine whose supervising task is gone.

    Every training process carries its supervisor's PID and start time in its environment; a
    worker that starts ends those whose supervisor no longer exists (a worker killed outright).
    """
    orphans: list[psutil.Process] = []
    for process in psutil.process_iter(["pid"]):
        try:
            env = process.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if "TRAINYARD_SUPERVISOR_PID" in env and not _supervisor_alive(env):
            orphans.append(process)
    for process in orphans:
        log.warning("ending orphaned training process %s (run %s)", process.pid,
                    _env_get(process, "TRAINYARD_RUN_ID"))  # fmt: skip
        process_tree_stop(root_pid=process.pid, extra_pids=[], grace_seconds=3)
    return [p.pid for p in orphans]


def _env_get(process: psutil.Process, name: str) -> str:
    try:
        return process.environ().get(name, "?")
    except psutil.Error:
        return "?"


def _supervisor_alive(env: dict[str, str]) -> bool:
    try:
        supervisor = psutil.Process(int(env["TRAINYARD_SUPERVISOR_PID"]))
        started = float(env.get("TRAINYARD_SUPERVISOR_STARTED", "0"))
        return abs(supervisor.create_time() - started) < 0.5
    except (psutil.NoSuchProcess, ValueError):
        return False
