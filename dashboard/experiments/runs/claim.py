"""The claim of a queued run by this machine's worker: start it here, route it, or say why it
waits. The task (tasks.py) acts on what it comes to."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from dashboard.experiments.core import transitions
from dashboard.experiments.core.access import reason_for_owner
from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.scheduling.allocation import (
    Machine,
    PlacementPlan,
    machines_lock,
    placement_candidates,
    placement_plan,
)
from dashboard.experiments.scheduling.queue import queue_turn_check, queue_turn_refusal


@dataclass(frozen=True)
class Claim:
    claimed: bool
    waiting_reason: str = ""
    routed_to: str = (
        ""  # the machine whose worker should claim it instead (allocation.PlacementPlan)
    )


def experiment_claim(*, experiment_id: int, machine: Machine, elsewhere: bool = False) -> Claim:
    """Start a queued run on this machine (node 0 of its machines) if their devices are free;
    else say what it waits for, or which machine's worker should claim it. `elsewhere`: a
    one-machine run this machine has no room for goes to another online machine that has room
    and where it is its turn (a run's first claim: a waiting run's task does not come back, so
    the shared queue's next worker will not try it).

    Only a queued run can become running (a conditional update), so two workers can never both
    start one run; the machines' locks make the device check and the claim one step, for all
    the machines of a multi-node run at once. The caller sends the other nodes their tasks once
    this has committed (tasks.run_nodes_send).
    """
    with transaction.atomic():
        # A Slurm run is its job's to start (runs/slurm/job.py), never a worker's.
        queued = Experiment.objects.filter(status=Status.QUEUED, backend=Backend.CELERY)
        experiment = queued.filter(pk=experiment_id).first()
        if experiment is None:
            return Claim(False)
        names = placement_candidates(experiment=experiment, local=machine)
        if machine.name not in names:
            return Claim(False, routed_to=names[0])
        rows = machines_lock(names)
        # Claim order first (queue.py: priority, then first in first out; the running limit).
        reason = queue_turn_refusal(experiment=experiment, machine=machine)
        plan = (
            PlacementPlan(reason=reason)
            if reason
            else placement_plan(
                experiment=experiment,
                local=machine,
                names=names,
                rows=rows,
                turn=queue_turn_check(experiment=experiment),
                elsewhere=elsewhere,
            )
        )
        if plan.route_to:
            return Claim(False, routed_to=plan.route_to)
        # Read once the plan has seen the devices free: the run that freed them ended before this
        # (its end's commit is what the plan read), so a start is never dated before that end.
        # Read before the locks, a claim that waited for them started 4 ms before it.
        now = timezone.now()
        if plan.placement:
            started = transitions.experiment_start(
                experiment=experiment, worker=machine.name, now=now, placement=plan.placement
            )
            return Claim(started)
        reason = plan.reason
        Experiment.objects.filter(pk=experiment_id, status=Status.QUEUED).update(
            waiting_reason=reason[:300], heartbeat_at=now
        )
    if reason[:300] != experiment.waiting_reason:
        waiting_reason_tell(experiment=experiment, reason=reason)
    return Claim(False, reason)


def waiting_reason_tell(*, experiment: Experiment, reason: str) -> None:
    """Tell the run's page why it waits (once per change of reason: the caller compares)."""
    sink = EventSink(experiment)
    said = reason_for_owner(experiment=experiment, reason=reason)  # the run's page's words
    sink.add({"type": "status", "status": Status.QUEUED, "reason": said})
    sink.flush()
