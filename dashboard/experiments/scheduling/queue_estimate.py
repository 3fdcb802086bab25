"""When each queued run may start: the claim rules replayed over the running runs' expected ends.

- A running run ends, we expect, at now + elapsed x (total_steps - step) / step: its progress so
  far, kept up, once it is PACE_FROM of the way through its steps. Before that its elapsed time
  is mostly start-up (a first step extrapolated said 7 m 33 s for a run that ended 10 s later), so
  it is expected to take as long as finished runs like it (below) from its start.
- A queued run takes as long as the mean wall time of the last TYPICAL_SAMPLE succeeded runs
  with the same strategy, dataset, processes, nodes, epochs and batch size.
- Then the queue is walked in claim order at now and at each expected end, on the worker
  machines online, with the claim's own rules (queue.turn_blocker, allocation.allocation_refusal,
  the running limit): a run starts at the first moment they let it. The users' turns
  (fair.fair_order) are taken again at each of those moments, from the runs running then. A run
  whose start depends on an end nobody can expect (too little progress and no finished run like
  it) gets no estimate.

Each estimate carries its basis in words (dashboard/texts.py), shown beside it: the end of which
run it waits for, and how that end was expected.
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
from dashboard.experiments.scheduling.fair import fair_order
from dashboard.experiments.scheduling.queue import (
    owners_served,
    run_could_use,
    running_limit,
    turn_blocker,
)
from dashboard.texts import (
    QUEUE_BASIS_FREE,
    QUEUE_BASIS_UNKNOWN,
    queue_basis_pace_text,
    queue_basis_typical_text,
    queue_basis_wait_text,
)

TYPICAL_SAMPLE = 5
# The share of its steps a running run has taken before its pace so far says when it ends.
PACE_FROM = 0.1
# The walk costs about (queued runs)^2 x machines checks: beyond this many, no estimate.
MOST_ESTIMATED = 300


@dataclass
class Slot:
    """A run holding machines in the replay, until `end` (None: nobody can say)."""

    run: Experiment
    hosts: list[str]
    end: datetime | None
    basis: str = ""  # how `end` was expected, in words


@dataclass(frozen=True)
class Estimate:
    """A queued run's expected start (None: nobody can say) and how it was reached."""

    start: datetime | None
    basis: str


class Durations:
    """Typical wall seconds of a run's kind, from finished runs; looked up once per kind."""

    def __init__(self) -> None:
        self.known: dict[tuple[Any, ...], tuple[float | None, int]] = {}

    @staticmethod
    def _kind(run: Experiment) -> tuple[Any, ...]:
        # A resnet's epoch is not a SimpleCNN's: the model is part of the kind.
        return (
            run.strategy, run.model, run.dataset, run.processes, run.nodes, run.epochs,
            run.batch_size,
        )  # fmt: skip

    def _lookup(self, run: Experiment) -> tuple[float | None, int]:
        """(mean wall seconds, how many finished runs) of the run's kind."""
        key = self._kind(run)
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
            self.known[key] = (sum(walls) / len(walls) if walls else None, len(walls))
        return self.known[key]

    def seconds(self, run: Experiment) -> float | None:
        return self._lookup(run)[0]

    def basis(self, run: Experiment) -> str:
        """How the run's length was expected: the finished runs like it, in words."""
        seconds, count = self._lookup(run)
        if seconds is None:
            return ""
        return queue_basis_typical_text(run=run.pk, runs=count, seconds=seconds)


def running_end(*, run: Experiment, now: datetime, durations: Durations) -> datetime | None:
    return running_end_explained(run=run, now=now, durations=durations)[0]


def running_end_explained(
    *, run: Experiment, now: datetime, durations: Durations
) -> tuple[datetime | None, str]:
    """When a running run is expected to end, and how that was reached (the module docstring)."""
    if run.started_at is None:
        return None, ""
    elapsed = (now - run.started_at).total_seconds()
    if run.total_steps and run.step >= max(1, PACE_FROM * run.total_steps):
        left = max(0, run.total_steps - run.step)
        basis = queue_basis_pace_text(
            run=run.pk, step=run.step, total=run.total_steps, seconds=elapsed
        )
        return now + timedelta(seconds=elapsed * left / run.step), basis
    typical = durations.seconds(run)
    if typical is None:
        return None, ""
    return max(now, run.started_at + timedelta(seconds=typical)), durations.basis(run)


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
        slots.append(Slot(run, hosts, end, durations.basis(run)))
        owners[run.owner_id] += 1
        started.append(run)
    return started


def queue_estimates(*, queued: list[Experiment], now: datetime) -> dict[int, datetime | None]:
    """Expected start of each queued run (claim order), None where it cannot be said."""
    return {pk: e.start for pk, e in queue_estimates_explained(queued=queued, now=now).items()}


def queue_estimates_explained(*, queued: list[Experiment], now: datetime) -> dict[int, Estimate]:
    """Expected start of each queued run (claim order) with its basis in words; no start and
    the reason where it cannot be said."""
    durations, machines = Durations(), machines_online()
    slots = []
    for run in Experiment.objects.filter(status=Status.RUNNING):
        end, basis = running_end_explained(run=run, now=now, durations=durations)
        slots.append(Slot(run, placement_workers(run), end, basis))
    waiting = list(queued[:MOST_ESTIMATED])
    served = owners_served({run.owner_id for run in waiting})
    estimates = {run.pk: Estimate(None, QUEUE_BASIS_UNKNOWN) for run in queued}
    at, basis = now, QUEUE_BASIS_FREE
    while waiting:
        # Whose turn comes next depends on who runs what now (a run reported from outside
        # holds no worker: queue.running_by_owner).
        running = Counter(slot.run.owner_id for slot in slots if not slot.run.reported)
        waiting = fair_order(waiting, running=running, served=served)
        for run in _round(waiting, slots, machines, at, durations):
            estimates[run.pk] = Estimate(at, basis)
            waiting.remove(run)
            served[run.owner_id] = at
        ends = [slot.end for slot in slots if slot.end is not None]
        if not ends:
            break
        # Each pass ends at least one slot, so the walk stops.
        at = max(at, min(ends))
        ending = [slot for slot in slots if slot.end is not None and slot.end <= at]
        basis = queue_basis_wait_text([slot.basis for slot in ending])
        slots = [slot for slot in slots if slot.end is None or slot.end > at]
    return estimates
