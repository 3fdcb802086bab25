"""The queue: the order queued runs are claimed in, and whose turn it is on a machine.

Claim order shares the machines between users (fair.fair_order): the next run is the next of
the user with the fewest runs running (then the one served least lately); a user's own runs go
by priority (higher first), then first in, first out (created_at, id). The rule, checked in the
claim's transaction (claim.experiment_claim) on every machine the run would take (a multi-node
run's further machines too, queue_turn_check): a run waits while an earlier queued run could
use the same resources of that machine (a GPU both want, or CPU threads when both need some)
and is not itself held back by its owner's running limit. A run that could never use this
machine (pinned elsewhere through `machines`, wanting GPUs it lacks, or a model or data it does
not have) does not hold anyone up there. There is no backfill: a small run does not slip past a
big one that waits for the whole machine, so the big one cannot starve.

The runs whose turn it is on a machine (queue_turns) are the ones woken when room frees there
(runs/parked.py): a run that waits has no task polling for it.

The running limit (TRAINYARD_MAX_ACTIVE_RUNS_PER_USER) is enforced here too, at claim time: a
study's runs are queued past the launch-time check (limits.launch_slot_claim) and wait here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Count, Max

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.scheduling.allocation import (
    Machine,
    catalogue_refusal,
    machine_catalogued,
    machine_from_row,
    run_cpu_threads,
)
from dashboard.experiments.scheduling.fair import fair_order

# A user's own runs: higher priority first, then first in, first out (fair.py between users).
CLAIM_ORDER = ("-priority", "created_at", "id")
# What staff may set: wide enough for any scheme of levels, narrow enough to read at a glance.
PRIORITY_RANGE = (-1000, 1000)


def queue_ordered(*, running: Counter[int] | None = None) -> list[Experiment]:
    """Every queued run for the workers, in the order they claim them (a Slurm run's job waits
    in its cluster's queue instead). `running`: running_by_owner(), where the caller has it."""
    queued = Experiment.objects.filter(status=Status.QUEUED, backend=Backend.CELERY)
    runs = list(queued.order_by(*CLAIM_ORDER))
    running = running_by_owner() if running is None else running
    return fair_order(runs, running=running, served=owners_served({run.owner_id for run in runs}))


def owners_served(owners: set[int]) -> dict[int, datetime | None]:
    """When each owner's latest run started (fair.py: the one served least lately goes first),
    on the workers: a run reported from outside took no turn on them (running_by_owner)."""
    rows = Experiment.objects.filter(owner_id__in=owners, started_at__isnull=False)
    rows = rows.exclude(reported=True)
    latest = rows.values("owner_id").annotate(last=Max("started_at"))
    return dict(latest.values_list("owner_id", "last"))


def queue_earlier(*, experiment: Experiment, ordered: list[Experiment]) -> list[Experiment]:
    """The queued runs of `ordered` claimed before this one."""
    index = next((i for i, run in enumerate(ordered) if run.pk == experiment.pk), len(ordered))
    return ordered[:index]


def ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 11th, 22nd."""
    if 10 <= number % 100 <= 20:
        return f"{number}th"
    return f"{number}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(number % 10, 'th') }"


def running_limit() -> int:
    """The most runs one user may hold running at once; 0 is no limit."""
    return max(0, settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER)


def running_by_owner() -> Counter[int]:
    rows = (
        Experiment.objects.filter(status=Status.RUNNING)
        .exclude(reported=True)  # a script elsewhere reporting in holds no worker
        .values("owner_id")
        .annotate(n=Count("id"))
        .values_list("owner_id", "n")
    )
    return Counter(dict(rows))


def owners_at_limit(running: Counter[int]) -> set[int]:
    most = running_limit()
    return {owner for owner, count in running.items() if most and count >= most}


def run_could_use(*, run: Experiment, machine: Machine) -> bool:
    """Whether this machine could ever host (a node of) the run: not pinned elsewhere, it has
    the GPUs the run names, and the run's model, dataset and image folder (a run that waits
    for another machine's data must not hold this one up)."""
    if run.machines and machine.name not in run.machines:
        return False
    if catalogue_refusal(experiment=run, machine=machine) is not None:
        return False
    return set(run.gpus) <= machine.gpu_ids


def runs_compete(*, first: Experiment, second: Experiment, machine: Machine) -> bool:
    """Whether two runs want the same resources on this machine: a GPU, or CPU threads (a GPU
    run takes no CPU threads, allocation.run_cpu_threads)."""
    if set(first.gpus) & set(second.gpus):
        return True

    def threads(run: Experiment) -> int:
        return run_cpu_threads(
            strategy=run.strategy, processes=run.processes, gpus=run.gpus,
            cpu_count=machine.cpu_count,
        )  # fmt: skip

    return bool(threads(first) and threads(second))


def hostnames_online() -> set[str]:
    """The names of the machines online (allocation.machines_online has their devices)."""
    return set(WorkerMachine.objects.online().values_list("hostname", flat=True))


def run_placeable(
    *, run: Experiment, online: set[str], machines: list[Machine] | None = None
) -> bool:
    """Whether the online machines could ever take the run: a run waiting for machines that are
    not there (a pinned one offline, more nodes than workers, fewer machines with its model
    and data than it spans) must not hold the others up, or one offline machine would stop
    every later run on the rest for good. `machines`: the online ones, as they reported."""
    if run.machines:
        return set(run.machines) <= online
    if run.nodes > 1 and machines is not None:
        having = [m for m in machines if catalogue_refusal(experiment=run, machine=m) is None]
        return run.nodes <= len(having)
    return run.nodes <= max(1, len(online))


class Turns:
    """Whose turn comes first on one machine: the runs that contend for it (not held back by
    their owner's running limit, able to use it, placeable on the machines online), and which
    of them competes with a later run (runs_compete)."""

    def __init__(self, *, machine: Machine, held: set[int]) -> None:
        self.machine = machine_catalogued(machine)
        self.online = hostnames_online() | {machine.name}
        self.held = held
        # The online machines as they reported, read once the first multi-node run needs them.
        self._reported: list[Machine] | None = None

    def contends(self, run: Experiment) -> bool:
        if run.owner_id in self.held or not run_could_use(run=run, machine=self.machine):
            return False
        if run.nodes > 1 and self._reported is None:
            rows = WorkerMachine.objects.online().exclude(hostname=self.machine.name)
            self._reported = [self.machine, *(machine_from_row(row) for row in rows)]
        return run_placeable(run=run, online=self.online, machines=self._reported)

    def blocker(self, run: Experiment, earlier: Iterable[Experiment]) -> Experiment | None:
        """The first run of `earlier` (claim order) whose turn here comes before `run`'s."""
        for other in earlier:
            if self.contends(other) and runs_compete(first=other, second=run, machine=self.machine):
                return other
        return None


def turn_blocker(
    *, run: Experiment, machine: Machine, earlier: Iterable[Experiment], held: set[int]
) -> Experiment | None:
    """The first run of `earlier` (claim order) whose turn on this machine comes before `run`'s,
    or None. `held`: owners at their running limit, whose runs cannot start anyway."""
    return Turns(machine=machine, held=held).blocker(run, earlier)


def queue_turns(
    *, machine: Machine, ordered: list[Experiment], held: set[int]
) -> list[tuple[Experiment, Experiment | None]]:
    """Each run of `ordered` (claim order) that contends for this machine, with the earlier run
    whose turn there comes first, or None where it is the run's turn now: those are the runs a
    freed device there could start, the ones to wake."""
    turns = Turns(machine=machine, held=held)
    contenders: list[Experiment] = []
    found: list[tuple[Experiment, Experiment | None]] = []
    for run in ordered:
        if not turns.contends(run):
            continue
        first = next(
            (o for o in contenders if runs_compete(first=o, second=run, machine=turns.machine)),
            None,
        )
        found.append((run, first))
        contenders.append(run)
    return found


def queue_turn_check(*, experiment: Experiment) -> Callable[[Machine], Experiment | None]:
    """The turn rule for the further machines of a multi-node run (allocation.placement_plan
    asks it of each machine it would take): without it, a run claimed on host-a would overtake
    an earlier run waiting on host-b there."""
    running = running_by_owner()
    held = owners_at_limit(running)
    earlier = queue_earlier(experiment=experiment, ordered=queue_ordered(running=running))

    def blocker(machine: Machine) -> Experiment | None:
        return turn_blocker(run=experiment, machine=machine, earlier=earlier, held=held)

    return blocker


def running_limit_refusal(*, owner_id: int, running: int) -> str | None:
    most = running_limit()
    if not most or running < most:
        return None
    return (
        f"waiting for one of its owner's runs to end: {running} running, the most one user may "
        f"run at once is {most} (TRAINYARD_MAX_ACTIVE_RUNS_PER_USER)"
    )


def turn_waiting_text(*, blocker: Experiment, machine: str, position: int) -> str:
    return (
        f"waiting behind #{blocker.pk}, whose turn on {machine} comes first; "
        f"{ordinal(position)} in the queue"
    )


def queue_turn_refusal(*, experiment: Experiment, machine: Machine) -> str | None:
    """Why the run may not start on this machine yet for the queue's sake, or None. Call in the
    claim's transaction, which holds the machine's lock; the owner's row is locked here so that
    two machines claiming one user's runs at once take turns (PostgreSQL; SQLite's IMMEDIATE
    transaction already serialises writers)."""
    if running_limit():
        users = get_user_model().objects.select_for_update()
        list(users.filter(pk=experiment.owner_id).values_list("pk"))
    running = running_by_owner()
    refused = running_limit_refusal(
        owner_id=experiment.owner_id, running=running[experiment.owner_id]
    )
    if refused:
        return refused
    earlier = queue_earlier(experiment=experiment, ordered=queue_ordered(running=running))
    blocker = turn_blocker(
        run=experiment, machine=machine, earlier=earlier, held=owners_at_limit(running)
    )
    if blocker is None:
        return None
    return turn_waiting_text(blocker=blocker, machine=machine.name, position=len(earlier) + 1)


def experiment_priority_set(*, experiment_id: int, priority: int) -> bool:
    """Move a queued run up or down among its owner's queued runs (staff only: the caller
    checks). A run that is not queued any more keeps its priority: it would mean nothing now."""
    low, high = PRIORITY_RANGE
    if not low <= priority <= high:
        raise ValueError(f"priority must be a whole number from {low} to {high}")
    return bool(
        Experiment.objects.filter(pk=experiment_id, status=Status.QUEUED).update(priority=priority)
    )


def machine_named(worker: str) -> Machine:
    """A machine as its worker last reported it (one CPU and no GPU where it never did)."""
    row = WorkerMachine.objects.filter(hostname=worker).first()
    return machine_from_row(row) if row is not None else Machine(worker, 1, frozenset())


def queue_heads_for(*, worker: str) -> list[Experiment]:
    """The queued runs whose turn it is on `worker` (claim order): what a device freed there
    could start."""
    running = running_by_owner()
    turns = queue_turns(
        machine=machine_named(worker),
        ordered=queue_ordered(running=running),
        held=owners_at_limit(running),
    )
    return [run for run, blocker in turns if blocker is None]
