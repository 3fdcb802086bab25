"""When each queued run may start: the claim rules replayed over the running runs' expected ends.

- A running run ends, we expect, at now + elapsed x (total_steps - step) / step: its progress so
  far, kept up (elapsed counts from its start, start-up included, so this errs late). Before its
  first step it is expected to take as long as finished runs like it (below) from its start.
- A queued run takes as long as the mean wall time of the last TYPICAL_SAMPLE succeeded runs
  with the same strategy, dataset, processes, nodes, epochs and batch size.
- Then the queue is walked in claim order at now and at each expected end, on the worker
  machines online, with the claim's own rules (queue.turn_blocker, allocation.allocation_refusal,
  the running limit): a run starts at the first moment they let it. A run whose start depends on
  an end nobody can expect (no progress and no finished run like it) gets no estimate (None).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.scheduling.allocation import (
    Machine,
    allocation_refusal,
    machines_online,
    placement_workers,
)
from dashboard.experiments.scheduling.queue import run_could_use, running_limit, turn_blocker

TYPICAL_SAMPLE = 5
# The walk costs about (queued runs)^2 x machines checks: beyond this many, no estimate.
MOST_ESTIMATED = 300


@dataclass
class Slot:
    """A run holding machines in the replay, until `end` (None: nobody can say)."""

    run: Experiment
    hosts: list[str]
    end: datetime | None


class Durations:
    """Typical wall seconds of a run's kind, from finished runs; looked up once per kind."""

    def __init__(self) -> None:
        self.known: dict[tuple[Any, ...], float | None] = {}

    def seconds(self, run: Experiment) -> float | None:
        # A resnet's epoch is not a SimpleCNN's: the model is part of the kind.
        key = (
            run.strategy, run.model, run.dataset, run.processes, run.nodes, run.epochs,
            run.batch_size,
        )  # fmt: skip
        if key not in self.known:
            like = Experiment.objects.filter(
                status=Status.SUCCEEDED,
                strategy=run.strategy, model=run.model, dataset=run.dataset,
                processes=run.processes,
                nodes=run.nodes, epochs=run.epochs, batch_size=run.batch_size,
                started_at__isnull=False, finished_at__isnull=False,
            )  # fmt: skip
            latest = like.order_by("-finished_at")[:TYPICAL_SAMPLE]
            rows = latest.values_list("started_at", "finished_at")
            walls = [(end - start).total_seconds() for start, end in rows]
            self.known[key] = sum(walls) / len(walls) if walls else None
        return self.known[key]


def running_end(*, run: Experiment, now: datetime, durations: Durations) -> datetime | None:
    if run.started_at is None:
        return None
    elapsed = (now - run.started_at).total_seconds()
    if run.step > 0 and run.total_steps:
        left = max(0, run.total_steps - run.step)
        return now + timedelta(seconds=elapsed * left / run.step)
    typical = durations.seconds(run)
    if typical is None:
        return None
    return max(now, run.started_at + timedelta(seconds=typical))


def _place(
    run: Experiment, machines: list[Machine], slots: list[Slot], earlier: list[Experiment],
    held: set[int],
) -> list[str] | None:  # fmt: skip
    """The machines the claim would give the run now in the replay, or None."""
    free = []
    for machine in machines:
        if not run_could_use(run=run, machine=machine):
            continue
        if turn_blocker(run=run, machine=machine, earlier=earlier, held=held) is not None:
            continue
        busy = [slot.run for slot in slots if machine.name in slot.hosts]
        if allocation_refusal(experiment=run, machine=machine, busy=busy) is None:
            free.append(machine.name)
    return free[: run.nodes] if len(free) >= max(1, run.nodes) else None


def _round(
    waiting: list[Experiment], slots: list[Slot], machines: list[Machine], at: datetime,
    durations: Durations,
) -> list[Experiment]:  # fmt: skip
    """Start, at `at`, every waiting run the claim rules let start; return them."""
    most = running_limit()
    owners = Counter(slot.run.owner_id for slot in slots)
    started: list[Experiment] = []
    for index, run in enumerate(waiting):
        held = {owner for owner, n in owners.items() if most and n >= most}
        if run.owner_id in held:
            continue
        earlier = [other for other in waiting[:index] if other not in started]
        hosts = _place(run, machines, slots, earlier, held)
        if hosts is None:
            continue
        typical = durations.seconds(run)
        end = at + timedelta(seconds=typical) if typical is not None else None
        slots.append(Slot(run, hosts, end))
        owners[run.owner_id] += 1
        started.append(run)
    return started


def queue_estimates(*, queued: list[Experiment], now: datetime) -> dict[int, datetime | None]:
    """Expected start of each queued run (claim order), None where it cannot be said."""
    durations, machines = Durations(), machines_online()
    running = Experiment.objects.filter(status=Status.RUNNING)
    slots = [
        Slot(run, placement_workers(run), running_end(run=run, now=now, durations=durations))
        for run in running
    ]
    waiting = list(queued[:MOST_ESTIMATED])
    starts: dict[int, datetime | None] = {run.pk: None for run in queued}
    at = now
    while waiting:
        for run in _round(waiting, slots, machines, at, durations):
            starts[run.pk] = at
            waiting.remove(run)
        ends = [slot.end for slot in slots if slot.end is not None]
        if not ends:
            break
        # Each pass ends at least one slot, so the walk stops.
        at = max(at, min(ends))
        slots = [slot for slot in slots if slot.end is None or slot.end > at]
    return starts
