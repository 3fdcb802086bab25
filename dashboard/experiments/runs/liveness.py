"""Whether this machine's part of a run should go on: its heartbeat, the other machines' rows,
the database.

The reaper (survival.py) gives up an attempt whose heartbeat stopped; a supervisor that finds
its attempt moved on, or that lost the database for longer than the heartbeat bound, ends its
processes rather than train twice (state.taken_over: the loop then only drains their streams).
"""

from __future__ import annotations

import logging
import time

from django import db
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.nodes import node_beat, node_peers
from dashboard.experiments.runs.process import TrainingProcess
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.state import AttemptState

log = logging.getLogger(__name__)

# On several machines: how long a node's processes may go on after another node's part failed
# (rank 0 reports the error it sees meanwhile) before this node ends them.
PEER_FAILED_GRACE_SECONDS = 5.0


def heartbeat_interval() -> float:
    return max(0.5, min(5.0, settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS / 6))


class Liveness:
    def __init__(
        self, *, experiment: Experiment, sink: EventSink, state: AttemptState,
        process: TrainingProcess, node_rank: int, machine: str, multinode: bool,
    ):  # fmt: skip
        self.experiment = experiment
        self.sink = sink
        self.state = state
        self.process = process
        self.node_rank = node_rank
        self.machine = machine
        self.multinode = multinode
        self.peer_failed_at: float | None = None
        self.beat_failed_at: float | None = None

    def heartbeat(self) -> None:
        if self.multinode:
            self._node_heartbeat()
            return
        alive = Experiment.objects.filter(
            pk=self.experiment.pk, status=Status.RUNNING, attempt=self.experiment.attempt
        ).update(heartbeat_at=timezone.now())
        self.beat_failed_at = None
        if alive:
            return
        # The reaper gave up on this attempt (it looked lost) and the run has moved on: end
        # this copy rather than train twice.
        self.state.taken_over = True
        self.process.stop(rank_pids=self.state.rank_pids, grace_seconds=2)

    def _node_heartbeat(self) -> None:
        """This node's beat, and what the other nodes' rows say (nodes.py)."""
        now = time.monotonic()
        alive = node_beat(
            experiment=self.experiment,
            node_rank=self.node_rank,
            worker=self.machine,
            launcher_pid=self.process.pid,
        )
        peers = node_peers(experiment=self.experiment, node_rank=self.node_rank)
        self.beat_failed_at = None
        if not alive or peers.moved_on:
            self.processes_end("the run moved on (lost, stopped or settled)")
        elif peers.failed and self.process.poll() is None:
            # Give rank 0 a moment to report the error it sees, then end what is blocked.
            self.peer_failed_at = self.peer_failed_at or now
            if now - self.peer_failed_at > PEER_FAILED_GRACE_SECONDS:
                self.sink.add_output(
                    f"ending this machine's processes: {'; '.join(peers.failed)}",
                    level="warning",
                    machine=self.machine,
                )
                self.process.stop(rank_pids=[], grace_seconds=2)

    def database_unreachable(self, exc: DatabaseError) -> None:
        """Cut off from the database (a machine off the network): the reaper (on several
        machines, the other nodes) gives this attempt up after the heartbeat bound; by then its
        processes must be gone too."""
        db.close_old_connections()
        now = time.monotonic()
        self.beat_failed_at = self.beat_failed_at or now
        log.warning("experiment %s: the database is unreachable: %s", self.experiment.pk, exc)
        if now - self.beat_failed_at > settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS:
            self.processes_end("this machine lost the database")

    def processes_end(self, why: str) -> None:
        """End this machine's processes for good."""
        if not self.state.taken_over:
            log.warning("experiment %s node %s: %s", self.experiment.pk, self.node_rank, why)
        self.state.taken_over = True
        self.process.stop(rank_pids=self.state.rank_pids, grace_seconds=2)
