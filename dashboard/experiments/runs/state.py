"""What the parts of one supervisor share about its attempt, in one place.

The relay, the requests, the liveness checks, the multi-node settlement and the outcome each
read some of it; each field says who writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from training.protocol import StartedEvent


@dataclass
class AttemptState:
    # The relay: the training's `started` and its last word (`finished` or `failed`), read with
    # .get (their fields are the training's word).
    started_event: StartedEvent | None = None
    final_event: dict[str, Any] | None = None
    # The relay: this machine's ranks (another machine's PIDs are strangers here), and each
    # rank's machine on several machines.
    rank_pids: list[int] = field(default_factory=list)
    rank_machines: list[str] = field(default_factory=list)
    # The requests: who asked for the Stop being carried out, and the checkpoint request passed
    # on to the training and not yet answered by a checkpoint event.
    stopped_by: str | None = None
    resuming: bool = False  # the Stop was "Stop and resume": the run is queued again (outcome.py)
    # A script run's Stop, agreed by its ranks (protocol 1.11's stop_pid): when the supervisor
    # ends what is left (its monotonic clock); None: no such Stop under way.
    stop_deadline: float | None = None
    checkpoint_signalled: datetime | None = None
    profile_signalled: int | None = None  # the profile request passed on to the training
    # Liveness: this machine's processes are ended for good (the run moved on, or the database
    # is lost); the loop only drains their streams.
    taken_over: bool = False
    returncode: int | None = None  # the launcher's, once it exited
    # The supervisor: when it first saw `finished` (its monotonic clock), and whether it ended
    # processes that outlived it by the teardown bound (runner.py).
    finished_seen: float | None = None
    teardown_ended: bool = False

    def rank0_here(self) -> bool:
        """Whether rank 0, which alone writes events, ran on this machine."""
        return self.started_event is not None or self.final_event is not None

    def training_finished(self) -> bool:
        return (self.final_event or {}).get("type") == "finished"
