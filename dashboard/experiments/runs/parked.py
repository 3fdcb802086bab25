"""Queued runs that wait are parked: no task of theirs comes back to ask again.

A run's claim that finds no room (or not its turn) stores why and ends; the run is woken when
something that could let it start happens, and only the runs whose turn it is on a machine are
woken there (queue.queue_turns), each by one message to that machine's worker
(tasks.queue_wake_send):
- a run ends or a queued one is cancelled (queue_wake.py, on `run_ended`): on every machine
  online, since its owner's share moved as well as its devices;
- a run is queued again (Stop and resume, the reaper): the same;
- a claim started a run: on every machine online, since the run no longer stands before others
  on the machines it did not take, and its owner's share moved (where room is left here, the
  next in turn takes it); a claim that found its run taken: the next in turn on that machine;
- a run's first claim held up on its worker: that run, on the other machines where it is its
  turn (nothing may end to wake it there);
- a priority changed, or a worker joined (its first report, queue_wake.py);
- as a net for a wake lost with the broker's messages, the reaper's beat wakes the runs whose
  turn it is and whose last claim is older than TRAINYARD_REDISPATCH_SECONDS: at most a few
  runs a machine a minute, never every waiting run.

The places of waiting runs move as others start, leave or come: the reaper's beat (every
TRAINYARD_REAPER_SECONDS) also writes the reasons that changed of the runs it does not wake
(whose turn comes first, and where they stand; their owner's running limit), so the queue page
and the runs' pages stay true without a claim of each. The wakes themselves write none: a place
moved is a write and a page message for every run behind (~10 ms each), which in each wake made
a Stop of the head of 640 queued runs take 17 s, and a run just started wait 8 s for its
supervisor (the reaper's bound on its heartbeat is 30 s).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.claim import waiting_reason_tell
from dashboard.experiments.scheduling.allocation import machine_from_row
from dashboard.experiments.scheduling.queue import (
    owners_at_limit,
    queue_ordered,
    queue_turns,
    running_by_owner,
    running_limit_refusal,
    turn_waiting_text,
)


@dataclass(frozen=True)
class Wake:
    """A run to wake on a machine: its worker's claim decides whether it starts."""

    experiment_id: int
    worker: str


def queue_wake_plan(
    *,
    workers: Collection[str] | None = None,
    due_before: datetime | None = None,
    runs: Collection[int] | None = None,
    reasons: bool = False,
) -> list[Wake]:
    """The runs whose turn it is on `workers` (every machine online: None), in claim order.
    `due_before`: only those whose last claim is older (the reaper's net), marked as tried now
    so that the next round leaves them alone. `runs`: only these are woken (a run's first
    claim, held up on its worker). `reasons`: the others' reasons are written too (the beat's)."""
    running = running_by_owner()
    ordered = queue_ordered(running=running)
    turns = turns_online(ordered=ordered, held=owners_at_limit(running))
    wakes = [
        Wake(run.pk, machine)
        for machine, run, first in turns
        if first is None
        and (workers is None or machine in workers)
        and (runs is None or run.pk in runs)
        and _due(run, due_before)
    ]
    if reasons:
        reasons_store(ordered=ordered, turns=turns, running=running)
    if due_before is not None:
        woken = {wake.experiment_id for wake in wakes}
        Experiment.objects.filter(pk__in=woken, status=Status.QUEUED).update(
            heartbeat_at=timezone.now()
        )
    return wakes


Turn = tuple[str, Experiment, Experiment | None]  # a machine, a run, whose turn there is first


def turns_online(*, ordered: list[Experiment], held: set[int]) -> list[Turn]:
    """queue.queue_turns on every machine online, in host name order."""
    if not ordered:
        return []
    return [
        (row.hostname, run, first)
        for row in WorkerMachine.objects.online().order_by("hostname")
        for run, first in queue_turns(machine=machine_from_row(row), ordered=ordered, held=held)
    ]


def reasons_store(*, ordered: list[Experiment], turns: list[Turn], running: Counter[int]) -> None:
    """Write the reasons that changed of the runs whose turn it is nowhere: their owner's
    running limit, else whose turn comes first on the first machine they wait for."""
    position = {run.pk: place for place, run in enumerate(ordered, start=1)}
    turn_now = {run.pk for _, run, first in turns if first is None}
    behind: dict[int, str] = {}
    for machine, run, first in turns:
        if first is not None:
            text = turn_waiting_text(blocker=first, machine=machine, position=position[run.pk])
            behind.setdefault(run.pk, text)
    for run in ordered:
        limit = running_limit_refusal(owner_id=run.owner_id, running=running[run.owner_id])
        said = limit or behind.get(run.pk)
        if run.pk not in turn_now and said:
            waiting_reason_store(experiment=run, reason=said)


def _due(run: Experiment, due_before: datetime | None) -> bool:
    """Not tried since `due_before`: a run never tried counts from its creation, so a run just
    launched (its task on its way) is not woken a second time, on another machine's queue, by
    the net's next round (the placement test's run went to the stack's worker, not its own)."""
    if due_before is None:
        return True
    return (run.heartbeat_at or run.created_at) < due_before


def waiting_reason_store(*, experiment: Experiment, reason: str) -> bool:
    """Store why a queued run waits, and tell its page, where the reason changed."""
    reason = reason[:300]
    if reason == experiment.waiting_reason:
        return False
    stored = Experiment.objects.filter(pk=experiment.pk, status=Status.QUEUED).update(
        waiting_reason=reason
    )
    if stored:
        waiting_reason_tell(experiment=experiment, reason=reason)
    return bool(stored)
