"""Wake the queue when room frees: a run ends (or a queued one is cancelled), or a worker joins.

Waiting runs are parked, with no task of theirs polling (runs/parked.py): these receivers wake
the runs whose turn it is (tasks.queue_wake_send), each on the machine where it is. The order
itself never depends on this: queue.queue_turn_refusal keeps it in every claim.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from dashboard.experiments.models import Experiment
from dashboard.experiments.tasks import queue_wake_on_commit, queue_wake_send


def run_ended_wake(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
    """The receiver of signals.run_ended, connected in ExperimentsConfig.ready: on every machine
    online, since the owner's share moved with the devices freed (and a cancelled queued run
    may have stood before others). A run reported from outside held no worker and counts in no
    share: its end (its script's request) moves nothing in the queue."""
    if Experiment.objects.filter(pk=experiment_id, reported=True).exists():
        return
    # Once the end is committed: a claim before that would still see the run holding its devices.
    queue_wake_on_commit()


def machine_joined_wake(sender: Any, *, hostname: str, **kwargs: Any) -> None:
    """The receiver of devices.signals.machine_joined: the runs whose turn it is there."""
    transaction.on_commit(lambda: queue_wake_send(workers=[hostname]), robust=True)
