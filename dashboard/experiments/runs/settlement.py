"""On several machines: which node settles the run, and with what (nodes.py: who settles).

Each node records how its part ended on its RunNode row; the node that had rank 0's events
settles, waiting for every other node to end first, and node 0 settles where none had them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError

from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.liveness import heartbeat_interval
from dashboard.experiments.runs.nodes import node_beat, node_end, node_peers
from dashboard.experiments.runs.state import AttemptState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodePart:
    """One machine's part of a multi-node attempt."""

    experiment: Experiment
    node_rank: int
    machine: str


def node_outcome(*, part: NodePart, state: AttemptState, outcome: Outcome) -> Outcome | None:
    """The outcome this node settles the run with, or None when it is not this node's to say."""
    _node_end(part=part, state=state, outcome=outcome)
    if state.rank0_here():
        if outcome.status in (Status.SUCCEEDED, Status.CANCELLED):
            return outcome
        return _peers_wait(part=part, outcome=outcome, holder=True)
    if part.node_rank == 0:
        # No events here: rank 0's node settles if it had any (a failure before `started`
        # too: a bad checkpoint, missing data; a Stop, which may have come after `finished`,
        # whose results must stand); if none had (a rendezvous error), node 0.
        return _peers_wait(part=part, outcome=outcome, holder=False)
    return None  # rank 0's node, node 0 or the reaper says how it ended


def _peers_wait(*, part: NodePart, outcome: Outcome, holder: bool) -> Outcome | None:
    """Wait for every other node to end, then settle with what each ended with; without rank
    0's events (`holder` False) a moment longer, for rank 0's node to settle first."""
    deadline = time.monotonic() + 3 * settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS
    all_ended_at: float | None = None
    while time.monotonic() < deadline:
        node_beat(experiment=part.experiment, node_rank=part.node_rank,
                  worker=part.machine, launcher_pid=0)  # fmt: skip
        peers = node_peers(experiment=part.experiment, node_rank=part.node_rank)
        if peers.moved_on:
            return None
        if peers.cancel_requested and holder:
            return Outcome(Status.CANCELLED, error="Stopped.")
        if peers.running == 0:
            all_ended_at = all_ended_at or time.monotonic()
        if all_ended_at is not None and (
            holder or time.monotonic() - all_ended_at >= 2 * heartbeat_interval()
        ):
            if peers.cancel_requested:
                return Outcome(Status.CANCELLED, error="Stopped.")
            failed = "\n".join(peers.failed)
            return Outcome(outcome.status, error="\n".join(filter(None, [outcome.error, failed])))
        time.sleep(heartbeat_interval())
    return outcome


def _node_end(*, part: NodePart, state: AttemptState, outcome: Outcome) -> None:
    # A node without rank 0 has no `finished` to see: exit 0 there is its part done well
    # (were it said failed, rank 0's node would end its training, in its final checkpoint).
    clean = not state.rank0_here() and state.returncode == 0 and state.stopped_by is None
    returncode = 0 if outcome.status == Status.SUCCEEDED or clean else 1
    try:
        node_end(experiment=part.experiment, node_rank=part.node_rank,
                 returncode=returncode, error=outcome.error)  # fmt: skip
    except DatabaseError:
        log.warning("experiment %s: could not record node %s's end", part.experiment.pk,
                    part.node_rank)  # fmt: skip
