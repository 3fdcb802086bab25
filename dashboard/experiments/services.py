"""What can be done to experiments: launch, stop, checkpoint, clone, read.

Views, the API and the admin call these."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from dashboard.experiments.core.checkpoints import checkpoint_as_dict
from dashboard.experiments.core.forms import FIELDS
from dashboard.experiments.core.limits import launch_slot_claim
from dashboard.experiments.core.messages import SnapshotMessage
from dashboard.experiments.core.run_facts import snapshot_texts
from dashboard.experiments.metrics.series import series_snapshot
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.lifecycle import run_cancel_queued
from dashboard.experiments.tasks import run_experiment_send

User = AbstractBaseUser | AnonymousUser


def experiment_launch(*, owner: Any, fields: dict[str, Any], limits: bool = True) -> Experiment:
    """Store a validated launch request and queue it once the row is committed. ``limits=False``:
    the caller checked the owner's limits for a launch of many runs (a study is one launch,
    whose runs wait in the queue rather than being refused by the active-run limit)."""
    with transaction.atomic():
        # Raises LaunchLimited over the owner's limits (concurrent runs, launches a minute).
        if limits:
            launch_slot_claim(owner=owner)
        experiment = Experiment.objects.create(owner=owner, **fields)
        transaction.on_commit(lambda: run_experiment_send(experiment=experiment))
    return experiment


def experiment_stop(*, experiment: Experiment, by: Any) -> bool:
    """Ask a run to stop. A queued run is cancelled at once; a running one by its supervisor."""
    now = timezone.now()
    if run_cancel_queued(
        experiment=experiment, by=by, error=f"Stopped by {by} before it started.", now=now
    ):
        return True
    requested = Experiment.objects.filter(
        pk=experiment.pk, status=Status.RUNNING, cancel_requested_at__isnull=True
    ).update(cancel_requested_at=now, cancelled_by=by)
    return bool(requested)


def experiment_checkpoint_request(*, experiment: Experiment, by: Any) -> str | None:
    """Ask a running run for a checkpoint now; its supervisor passes the request on to the
    training, which writes it after its current step. Returns why it cannot, or None."""
    requested = Experiment.objects.filter(
        pk=experiment.pk, status=Status.RUNNING, cancel_requested_at__isnull=True
    ).update(checkpoint_requested_at=timezone.now(), checkpoint_requested_by=by)
    if requested:
        return None
    experiment.refresh_from_db()
    if experiment.status == Status.RUNNING:
        return "the run is stopping"
    if experiment.status == Status.QUEUED:
        return "the run has not started yet; ask again once it is running"
    return f"the run is {experiment.status}; only a running run can write a checkpoint"


def experiment_clone(*, experiment: Experiment, owner: Any) -> Experiment:
    fields = {name: getattr(experiment, name) for name in FIELDS}
    fields["name"] = f"{experiment.name} (again)"[:200]
    clone = experiment_launch(owner=owner, fields=fields)
    Experiment.objects.filter(pk=clone.pk).update(cloned_from=experiment)
    return clone


def experiment_run_facts(experiment: Experiment) -> dict[str, Any]:
    """What the `started` event said about where the run lives: shared tensors, stages."""
    info = experiment.run_info or {}
    tensors = info.get("shared_tensors")
    stages = info.get("stages")
    return {
        "shared_tensors": [t for t in tensors if isinstance(t, dict)]
        if isinstance(tensors, list)
        else [],
        "stages": [s for s in stages if isinstance(s, dict)] if isinstance(stages, list) else [],
        "zero_stage": info.get("zero_stage"),
        "world_size": info.get("world_size"),
        "global_batch_size": info.get("global_batch_size"),
        "machines": info.get("machines"),  # each rank's machine (protocol 1.5)
    }


def experiment_snapshot_build(*, experiment: Experiment, log_lines: int) -> SnapshotMessage:
    """What a page needs to draw a run from scratch: the WebSocket's first message. Its size
    is bounded whatever the run's length: series come bucketed, logs as the last lines."""
    logs = [line.as_dict() for line in experiment.logs.order_by("-seq", "-id")[:log_lines]]
    logs.reverse()
    run, rank_stats = experiment_run_facts(experiment), experiment.rank_stats or {}
    checkpoints = [
        checkpoint_as_dict(checkpoint=c, experiment=experiment)
        for c in experiment.checkpoints.all()
    ]
    return {
        "type": "snapshot",
        "seq": experiment.last_seq,
        "experiment": experiment_as_dict(experiment),
        "series": dict(series_snapshot(experiment=experiment)),
        "logs": logs,
        "run": run,
        "rank_stats": rank_stats,
        "checkpoints": checkpoints,
        "texts": snapshot_texts(run=run, rank_stats=rank_stats, checkpoints=checkpoints),
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def experiment_as_dict(experiment: Experiment) -> dict[str, Any]:
    data: dict[str, Any] = {"id": experiment.pk}
    data.update({name: getattr(experiment, name) for name in FIELDS})
    data.update(
        owner=experiment.owner.get_username(),
        status=experiment.status,
        created_at=_iso(experiment.created_at),
        started_at=_iso(experiment.started_at),
        finished_at=_iso(experiment.finished_at),
        worker=experiment.worker,
        error=experiment.error,
        test_loss=experiment.test_loss,
        test_accuracy=experiment.test_accuracy,
        epoch=experiment.epoch,
        step=experiment.step,
        total_steps=experiment.total_steps,
        last_seq=experiment.last_seq,
        notes=experiment.notes,
        dataset_source=experiment.run_info.get("dataset_source"),
        waiting_reason=experiment.waiting_reason,
        attempt=experiment.attempt,
        attempts=experiment.attempts,
        heartbeat_at=_iso(experiment.heartbeat_at),
        stop_requested=experiment.cancel_requested_at is not None,
        checkpoint_requested=experiment.checkpoint_requested_at is not None,
        cancelled_by=experiment.cancelled_by.get_username() if experiment.cancelled_by else None,
        duration=experiment.duration_seconds,
        url=experiment.get_absolute_url(),
        devices_label=experiment.devices_label(),
        tags=experiment.tags,
        note=experiment.note,
        # Brought in by POST /api/experiments/import/: no worker trained it here.
        imported=experiment.imported,
        # The machines of the current (or last) attempt, node 0 first, with the ranks each ran.
        placement=experiment.placement,
    )
    return data
