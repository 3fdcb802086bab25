"""A run over several machines: each machine's part of it (a node), its heartbeat and its end.

Node 0 is the worker that claimed the run (claim.experiment_claim: all machines in one
transaction, written to `Experiment.placement`); node k >= 1 is started on its own machine by the
`run_node` task. Every node runs the same training command with torchrun's c10d rendezvous flags
(`node_flags`), and its own supervisor (runner.RunSupervisor) looks after its processes:

- it beats in its `RunNode` row and in the run's row; the reaper (survival.py) loses the whole
  run when one node falls silent, and every other node then sees the run moved on and ends its
  processes (rather than leave them blocked in a collective);
- it relays its processes' stderr tagged with its machine, and samples its machine;
- it ends its processes on a Stop, when the run has moved on, when another node's part ended
  in failure, and when it cannot reach the database for the heartbeat bound (a machine cut off
  ends its own part: the others have given it up by then);
- torchrun orders the nodes itself (it sorts their descriptors), so global rank 0, which writes
  the events and checkpoints, may be on any node: every node reads its stdout for events, and
  the one that gets them stores them.

The run is settled once, by a conditional update (transitions.experiment_finish): the node that
saw `finished` settles success; a Stop or a failure is settled by the node with rank 0 (the
one that got its events, `started` or only `failed`; a failure once every other node has ended
and its error says what each ended with), or by node 0 a moment after every node ended when no
node got any (a rendezvous error, a Stop during the rendezvous); a node that falls silent leaves
it to the reaper (lost, then resumed from the newest checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from dashboard.experiments.models import Experiment, RunNode, Status


def run_multinode(experiment: Experiment) -> bool:
    return experiment.nodes > 1 and len(experiment.placement or []) > 1


def rendezvous_id(experiment: Experiment) -> str:
    """One id per attempt: a resumed attempt never meets a straggler of the one before."""
    return f"trainyard-{experiment.pk}-{experiment.attempt}"


def node_entry(experiment: Experiment, node_rank: int) -> dict[str, Any]:
    entry = experiment.placement[node_rank]
    return entry if isinstance(entry, dict) else {}


def node_flags(*, experiment: Experiment, node_rank: int) -> list[str]:
    """The training's rendezvous flags on node `node_rank` (training/cli.py passes them on to
    torchrun); the store is on node 0's address, which hosts it."""
    first, entry = node_entry(experiment, 0), node_entry(experiment, node_rank)
    flags = [
        "--nnodes", str(len(experiment.placement)),
        "--rdzv-endpoint", str(first["rdzv_endpoint"]),
        "--rdzv-id", rendezvous_id(experiment),
    ]  # fmt: skip
    if entry.get("address"):
        flags += ["--local-addr", str(entry["address"])]
    if node_rank == 0:
        flags.append("--rdzv-host")
    return flags


@dataclass(frozen=True)
class NodeTask:
    """A further node's task of a just-claimed attempt, for its machine's queue (tasks.py)."""

    experiment_id: int
    attempt: int
    node_rank: int
    machine: str


def nodes_further(*, experiment_id: int) -> list[NodeTask]:
    """Node 1 and up of a just-claimed run's attempt (node 0 is the claim's own machine)."""
    run = Experiment.objects.filter(pk=experiment_id).values("attempt", "placement").first()
    if run is None:
        return []
    return [
        NodeTask(
            experiment_id=experiment_id,
            attempt=run["attempt"],
            node_rank=int(entry["node_rank"]),
            machine=str(entry["worker"]),
        )  # fmt: skip
        for entry in (run["placement"] or [])[1:]
    ]


def placement_with_ranks(placement: list[Any], machines: list[str]) -> list[Any]:
    """The placement with each machine's global ranks, from the `started` event's `machines`
    (rank order): torchrun's rendezvous, not the claim, decided them."""
    filled = []
    for entry in placement:
        if isinstance(entry, dict):
            worker = entry.get("worker")
            entry = {**entry, "ranks": [r for r, m in enumerate(machines) if m == worker]}
        filled.append(entry)
    return filled


def pids_on_machine(*, pids: Any, machines: Any, machine: str) -> list[int]:
    """The ranks' PIDs (the `started` event's `pids`, rank order) of the ranks on `machine`: a PID
    of another machine's rank may be any process here, never one to signal. Without `machines`
    (an older training) none is known to be here."""
    if not isinstance(pids, list) or not isinstance(machines, list) or len(machines) != len(pids):
        return []
    return [
        int(p)
        for p, m in zip(pids, machines, strict=True)
        if m == machine and isinstance(p, int) and not isinstance(p, bool)
    ]


def rank_pids_here(*, pids: Any, machines: Any, machine: str | None) -> list[int]:
    """The PIDs of the ranks this machine may signal: on several machines (`machine` named)
    only its own (pids_on_machine); on one, every rank's."""
    if machine is not None:
        return pids_on_machine(pids=pids, machines=machines, machine=machine)
    return [int(p) for p in pids or [] if isinstance(p, int) and not isinstance(p, bool)]


def rank_machines_store(*, experiment: Experiment, machines: list[str]) -> None:
    placement = placement_with_ranks(list(experiment.placement or []), machines)
    # The attempt's own placement only: a later attempt has placed the run anew.
    Experiment.objects.filter(pk=experiment.pk, attempt=experiment.attempt).update(
        placement=placement
    )
    experiment.placement = placement


def node_beat(*, experiment: Experiment, node_rank: int, worker: str, launcher_pid: int) -> bool:
    """This node's heartbeat, in its row and in the run's; whether its attempt still runs."""
    now = timezone.now()
    RunNode.objects.update_or_create(
        experiment_id=experiment.pk,
        attempt=experiment.attempt,
        node_rank=node_rank,
        defaults={"worker": worker, "heartbeat_at": now, "launcher_pid": launcher_pid},
        create_defaults={
            "worker": worker,
            "heartbeat_at": now,
            "launcher_pid": launcher_pid,
            "started_at": now,
        },
    )
    alive = Experiment.objects.filter(
        pk=experiment.pk, status=Status.RUNNING, attempt=experiment.attempt
    ).update(heartbeat_at=now)
    return alive == 1


def node_end(*, experiment: Experiment, node_rank: int, returncode: int, error: str) -> None:
    """This node's part ended: it is not silent from now on, and says how it ended."""
    RunNode.objects.filter(
        experiment_id=experiment.pk, attempt=experiment.attempt, node_rank=node_rank
    ).update(ended_at=timezone.now(), returncode=returncode, error=error[:2000])


@dataclass(frozen=True)
class Peers:
    """The other nodes of this attempt, as their rows say."""

    failed: list[str]  # "host-b (node 1): exit 1" for each whose part ended in failure
    running: int  # not ended yet (or not started yet)
    moved_on: bool  # the run is no longer this attempt's running one
    cancel_requested: bool


def node_peers(*, experiment: Experiment, node_rank: int) -> Peers:
    row = (
        Experiment.objects.filter(pk=experiment.pk)
        .values("status", "attempt", "cancel_requested_at")
        .first()
    )
    moved_on = row is None or (row["status"], row["attempt"]) != (
        Status.RUNNING,
        experiment.attempt,
    )
    others = RunNode.objects.filter(experiment_id=experiment.pk, attempt=experiment.attempt)
    others = others.exclude(node_rank=node_rank)
    ended = [n for n in others if n.ended_at is not None]
    failed = [
        f"{n.worker} (node {n.node_rank}): exit {n.returncode}"
        + (f", {n.error.splitlines()[0]}" if n.error.strip() else "")
        for n in ended
        if n.returncode != 0
    ]
    running = len(experiment.placement) - 1 - len(ended)
    cancel = row is not None and row["cancel_requested_at"] is not None
    return Peers(failed=failed, running=running, moved_on=moved_on, cancel_requested=cancel)


def nodes_silent(*, now: datetime) -> dict[int, str]:
    """Running multi-node runs with a node silent past the heartbeat bound: run id -> why.

    A node that ended said so (not silent); one that never started counts from when node 0
    started its part."""
    bound = timedelta(seconds=settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS)
    # A node's task waits in its machine's queue while that machine is cut off or its worker
    # reconnects to the broker: give it until the machine would count as offline, so that a
    # machine which comes back joins the attempt, and one that does not is left out of the next
    # placement instead of costing attempt after attempt.
    start_bound = max(bound, timedelta(seconds=settings.TRAINYARD_WORKER_STALE_SECONDS))
    silent: dict[int, str] = {}
    running = Experiment.objects.filter(status=Status.RUNNING, nodes__gt=1)
    for experiment in running:
        rows = {
            n.node_rank: n
            for n in RunNode.objects.filter(experiment_id=experiment.pk, attempt=experiment.attempt)
        }
        first = rows.get(0)
        for rank, entry in enumerate(experiment.placement or []):
            worker = entry.get("worker") if isinstance(entry, dict) else "?"
            node = rows.get(rank)
            if node is None and first is not None and now - first.started_at > start_bound:
                quiet = (now - first.started_at).total_seconds()
                silent[experiment.pk] = (
                    f"machine {worker} (node {rank}) never started ({quiet:.0f} s)"
                )
            elif node is not None and node.ended_at is None and now - node.heartbeat_at > bound:
                quiet = (now - node.heartbeat_at).total_seconds()
                silent[experiment.pk] = (
                    f"no heartbeat from machine {worker} (node {rank}) for {quiet:.0f} s"
                )
    return silent


def runs_on_machine(*, worker: str) -> list[RunNode]:
    """The parts of running multi-node runs this machine supervises (for a shutdown)."""
    return [
        node
        for node in RunNode.objects.filter(
            worker=worker, ended_at=None, experiment__status=Status.RUNNING
        ).select_related("experiment")
        if node.attempt == node.experiment.attempt and node.launcher_pid
    ]
