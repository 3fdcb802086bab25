"""What can be done to experiments: launch, stop, checkpoint, profile, clone (the writes; the
reads are in selectors.py).

Views, the API and the admin call these."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboard.experiments.core.forms import experiment_clone_fields
from dashboard.experiments.core.limits import launch_slot_claim
from dashboard.experiments.core.profiles import profile_refusal
from dashboard.experiments.core.stalls import (
    RESUME_NOT_STALLED,
    resume_moved_on_text,
    resume_plan,
)
from dashboard.experiments.models import PROFILE_IN_FLIGHT, Backend, Experiment, Profile, Status
from dashboard.experiments.runs.lifecycle import run_cancel_queued
from dashboard.experiments.runs.reported import reported_run_stop_silent
from dashboard.experiments.runs.slurm.submit import (
    slurm_run_reprioritised,
    slurm_run_stopped,
    slurm_run_submit,
)
from dashboard.experiments.scheduling.queue import experiment_priority_set
from dashboard.experiments.scheduling.slurm.launch import slurm_launch_refusals
from dashboard.experiments.tasks import queue_wake_send, queue_wakes_held, run_experiment_send

User = AbstractBaseUser | AnonymousUser


def experiment_launch(
    *,
    owner: Any,
    fields: dict[str, Any],
    limits: bool = True,
    cloned_from: Experiment | None = None,
) -> Experiment:
    """Store a validated launch request and queue it once the row is committed. ``limits=False``:
    the caller checked the owner's limits for a launch of many runs (a study is one launch,
    whose runs wait in the queue rather than being refused by the active-run limit).
    ``cloned_from``: the run this one copies (the admin's action, the form's "Run again")."""
    with transaction.atomic():
        # Raises LaunchLimited over the owner's limits (concurrent runs, launches a minute).
        if limits:
            launch_slot_claim(owner=owner)
        experiment = Experiment.objects.create(owner=owner, cloned_from=cloned_from, **fields)
        transaction.on_commit(lambda: run_send(experiment=experiment))
    return experiment


def experiment_launch_refusals(*, fields: dict[str, Any]) -> dict[str, list[str]]:
    """What the run's backend refuses of a valid launch, by field, before it is stored: on
    Slurm, a run no partition of the cluster could ever hold (the form and the API say it)."""
    if fields.get("backend") != Backend.SLURM:
        return {}
    return slurm_launch_refusals(
        partition=fields.get("partition") or "",
        nodes=fields.get("nodes") or 1,
        ranks_per_node=fields.get("processes") or 1,
        gpus_per_node=len(fields.get("gpus") or []),
        time_limit_minutes=fields.get("time_limit_minutes"),
    )


def run_send(*, experiment: Experiment) -> None:
    """Hand a committed run to its backend: the workers' queue, or the Slurm cluster's (sbatch;
    a job it refuses fails the run with its words)."""
    if experiment.backend == Backend.SLURM:
        slurm_run_submit(experiment_id=experiment.pk)
        experiment.refresh_from_db()  # the launch answers with its job (or why it has none)
    else:
        run_experiment_send(experiment=experiment)


def experiment_priority_change(*, experiment_id: int, priority: int) -> bool:
    """Move a queued run among its owner's queued runs (staff only: the caller checks); False
    where it is not queued any more. Raises ValueError outside queue.PRIORITY_RANGE."""
    changed = experiment_priority_set(experiment_id=experiment_id, priority=priority)
    if changed:
        queue_turns_changed()
        slurm_priority_changed(experiment_id=experiment_id)
    return changed


def slurm_priority_changed(*, experiment_id: int) -> None:
    """Once committed, a Slurm run's pending job takes its new priority as its nice (a run on
    the workers: nothing to do)."""
    transaction.on_commit(lambda: slurm_run_reprioritised(experiment_id=experiment_id), robust=True)


def queue_turns_changed() -> None:
    """Once committed, wake the runs whose turn it is now (a priority moved: its run may be next
    among its owner's), and say the others' new places (runs/parked.py)."""
    transaction.on_commit(queue_wake_send, robust=True)


def experiment_stop(*, experiment: Experiment, by: Any) -> bool:
    """Ask a run to stop. A queued run is cancelled at once; a running one by its supervisor,
    or, reported from outside, by its script (at once where it has fallen silent)."""
    now = timezone.now()
    if run_cancel_queued(
        experiment=experiment, by=by, error=f"Stopped by {by} before it started.", now=now
    ):
        # A Slurm run's job goes with it (scancel), pending or just starting.
        transaction.on_commit(lambda: slurm_run_stopped(experiment=experiment), robust=True)
        return True
    if reported_run_stop_silent(experiment=experiment, by=by):
        return True  # reported from outside and silent: no script is there to hear it
    requested = Experiment.objects.filter(
        pk=experiment.pk, status=Status.RUNNING, cancel_requested_at__isnull=True
    ).update(cancel_requested_at=now, cancelled_by=by)
    return bool(requested)


def experiments_stop(*, experiments: Iterable[Experiment], by: Any) -> list[int]:
    """experiment_stop for each run (a study's, the admin's selection), the queue woken once for
    all the queued ones cancelled (tasks.queue_wakes_held); returns the ids stopped."""
    with queue_wakes_held():
        return [
            experiment.pk
            for experiment in experiments
            if experiment_stop(experiment=experiment, by=by)
        ]


def experiment_checkpoint_request(*, experiment: Experiment, by: Any) -> str | None:
    """Ask a running run for a checkpoint now; its supervisor passes the request on to the
    training, which writes it after its current step. Returns why it cannot, or None."""
    requested = Experiment.objects.filter(
        pk=experiment.pk, status=Status.RUNNING, cancel_requested_at__isnull=True
    ).update(checkpoint_requested_at=timezone.now(), checkpoint_requested_by=by)
    if requested:
        return None
    experiment.refresh_from_db()
    return _not_running_text(experiment, "write a checkpoint")


def experiment_resume_request(*, experiment: Experiment, by: Any, attempt: int) -> str | None:
    """Ask a stalled run to stop and resume from its last checkpoint (the stalled banner's
    button), for the ``attempt`` the page showed: its supervisor ends every process as for a
    Stop, then queues the run again, and the next attempt starts from the newest checkpoint
    (pinned to the worker that holds its file where no shared folder has it: resume_plan). The
    request is bound to that attempt and its stall, so a retry or a second tab never stops the
    next attempt. Returns why it cannot, or None."""
    plan = resume_plan(experiment=experiment)
    if not plan.offer["resumable"]:
        return plan.offer["text"]
    pin = {"machines": [plan.pin]} if plan.pin and not experiment.machines else {}
    requested = Experiment.objects.filter(
        pk=experiment.pk,
        status=Status.RUNNING,
        attempt=attempt,
        stalled__isnull=False,
        cancel_requested_at__isnull=True,
    ).update(cancel_requested_at=timezone.now(), cancelled_by=by, resume_requested=True, **pin)
    if requested:
        return None
    experiment.refresh_from_db()
    running, queued = experiment.status == Status.RUNNING, experiment.status == Status.QUEUED
    if running and experiment.attempt != attempt or queued and experiment.attempt > attempt:
        return resume_moved_on_text(asked=attempt, now=experiment.attempt)
    if experiment.status == Status.RUNNING and experiment.cancel_requested_at is None:
        return RESUME_NOT_STALLED
    return _not_running_text(experiment, "be stopped and resumed")


def experiment_profile_request(
    *, experiment: Experiment, steps: int, by: Any
) -> tuple[Profile | None, str]:
    """Ask a running run for a profile of its next `steps` steps on every rank; its supervisor
    passes it on (runs/requests.py). Returns the new profile, or None and why it cannot be."""
    refused = profile_refusal(experiment=experiment)
    if refused:
        return None, refused
    try:
        with transaction.atomic():
            # The run's row locked while it is checked and the request added: a run that ends
            # meanwhile (its transition fails the profiles in flight) waits for this one, so
            # no request is left on an ended run.
            locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
            if locked.status != Status.RUNNING or locked.cancel_requested_at is not None:
                return None, _not_running_text(locked, "record a profile")
            # The database holds one in flight per run (Profile's constraint): two requests
            # at once, one wins.
            return Profile.objects.create(experiment=experiment, steps=steps, requested_by=by), ""
    except IntegrityError:
        flying = experiment.profiles.filter(state__in=PROFILE_IN_FLIGHT).first()
        what = f"{flying.state}, {flying.steps} step(s)" if flying else "in flight"
        return None, f"a profile is already being recorded ({what}); ask again once it is ready"


def _not_running_text(experiment: Experiment, doing: str) -> str:
    if experiment.status == Status.RUNNING:
        return "the run is stopping"
    if experiment.status == Status.QUEUED:
        return "the run has not started yet; ask again once it is running"
    return f"the run is {experiment.status}; only a running run can {doing}"


def experiment_clone(*, experiment: Experiment, owner: Any) -> Experiment:
    fields = experiment_clone_fields(source=experiment)
    return experiment_launch(owner=owner, fields=fields, cloned_from=experiment)
