"""Runs that outlive their workers: the reaper, lost task messages, orphaned training processes.

Delivery is early-acknowledged (CELERY_TASK_ACKS_LATE=False): a broker never redelivers a
long run by itself (Redis' visibility timeout would start a second copy after an hour). Instead
the supervising task writes a heartbeat, and the reaper (Celery beat) marks a run whose heartbeat
stopped as `lost` and queues it again, to resume from its last checkpoint (attempts.py chooses
it). The reaper returns what it queued and the beat task sends it: nothing here imports a task.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta

import psutil
from django.conf import settings
from django.utils import timezone

from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.runs.attempts import attempts_summary, attempts_with_current
from dashboard.experiments.runs.lifecycle import run_give_up, run_lose, run_requeue
from dashboard.experiments.runs.nodes import nodes_silent
from dashboard.experiments.runs.processes import process_tree_stop
from dashboard.experiments.runs.sink import EventSink

log = logging.getLogger(__name__)


def supervisor_started() -> float:
    return psutil.Process(os.getpid()).create_time()


@dataclass(frozen=True)
class Reaped:
    """What the reaper found: runs gone silent, and those of them queued to resume, which the
    caller (the beat task) sends to a worker."""

    lost: list[int]
    requeued: list[int]


def experiments_reap_lost(*, now: datetime | None = None) -> Reaped:
    """Mark runs whose heartbeat stopped as lost; queue them again while attempts remain. A
    Slurm run is its reconciler's (runs/slurm/reconcile.py): its job's state says more."""
    now = now or timezone.now()
    bound = timedelta(seconds=settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS)
    lost, requeued = [], []
    stale = Experiment.objects.filter(
        status=Status.RUNNING, heartbeat_at__lt=now - bound, backend=Backend.CELERY
    )
    # On several machines one silent node loses the whole run (nodes.py), though others beat.
    silent = nodes_silent(now=now)
    stale = stale | Experiment.objects.filter(pk__in=list(silent), status=Status.RUNNING)
    for experiment in stale:
        left_as = experiment_mark_lost(
            experiment=experiment, now=now, why=silent.get(experiment.pk)
        )
        if left_as is not None:
            lost.append(experiment.pk)
        if left_as == Status.QUEUED:
            requeued.append(experiment.pk)
    return Reaped(lost=lost, requeued=requeued)


def experiment_mark_lost(
    *, experiment: Experiment, now: datetime, why: str | None = None, own_silence: bool = False
) -> str | None:
    """Lose one silent run (`why`: one of its machines fell silent, or its Slurm job ended the
    attempt; `own_silence`: `why` says the run's own heartbeat stopped, as with no `why`), then
    queue it again or give it up. Returns the status it was left in, or None when it was not
    silent any more (another reaper, a late heartbeat) or its attempt had moved on."""
    assert experiment.heartbeat_at is not None
    silent = (now - experiment.heartbeat_at).total_seconds()
    reason = why or f"no heartbeat from worker {experiment.worker} for {silent:.0f} s"
    history = attempts_with_current(
        experiment=experiment, outcome=Status.LOST, reason=reason, ended_at=now
    )
    sink = EventSink(experiment)  # numbers its messages after the stored ones when it flushes
    if not run_lose(
        experiment=experiment, sink=sink, reason=reason, history=history,
        # A heartbeat since the caller read the run keeps it, where the silence is its own.
        node_silent=why is not None and not own_silence,
    ):  # fmt: skip
        return None
    log.warning("experiment %s lost: %s", experiment.pk, reason)
    experiment.refresh_from_db()
    if experiment.attempt < settings.TRAINYARD_MAX_ATTEMPTS:
        waiting = f"attempt {experiment.attempt} lost ({reason}); queued to resume"
        if run_requeue(sink=sink, waiting_reason=waiting, now=timezone.now()):
            return Status.QUEUED
    elif run_give_up(sink=sink, error=attempts_summary(history), now=now):
        return Status.FAILED
    return Status.LOST


def experiments_redispatch_queued(*, now: datetime | None = None) -> list[int]:
    """Queued runs never tried whose first task message may have been lost (a Redis restart
    without persistence): the caller sends them again. A duplicate is harmless: only one claim
    of a queued run can succeed. Each is marked sent here, so the next round leaves it alone for
    a while. A run tried once has a reason and waits parked (runs/parked.py): it is not sent
    again here, but woken, or caught by the net under the wake-ups when its turn comes."""
    now = now or timezone.now()
    bound = now - timedelta(seconds=settings.TRAINYARD_REDISPATCH_SECONDS)
    stale = Experiment.objects.filter(
        status=Status.QUEUED, heartbeat_at=None, created_at__lt=bound, backend=Backend.CELERY
    )
    resend = []
    for experiment in stale:
        if Experiment.objects.filter(pk=experiment.pk, status=Status.QUEUED).update(
            heartbeat_at=now
        ):
            resend.append(experiment.pk)
    return resend


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
