"""Wake the head of the queue when a run ends, so a freed device does not sit idle for a retry.

A waiting run's task message comes back every TRAINYARD_WAIT_RETRY_SECONDS; when a run ends,
the first queued run that could start on the machine it freed gets a nudge at once on that
machine's queue (a second message, `wake=True`, which gives up instead of retrying: the run's own
message still does).
The order itself never depends on this: queue.queue_turn_refusal keeps it in every claim.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from dashboard.devices.facts import machine_queue
from dashboard.experiments.models import Experiment
from dashboard.experiments.scheduling.queue import queue_head_for
from dashboard.experiments.tasks import run_experiment


def run_ended_wake(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
    """The receiver of signals.run_ended, connected in ExperimentsConfig.ready."""
    worker = Experiment.objects.filter(pk=experiment_id).values_list("worker", flat=True).first()
    if not worker:  # cancelled while queued: no device freed
        return
    head = queue_head_for(worker=worker)
    if head is not None:
        head_id, queue = head.pk, machine_queue(worker)
        # To the machine that freed the device: its worker is the one that can claim it now.
        transaction.on_commit(
            lambda: run_experiment.apply_async((head_id,), {"wake": True}, queue=queue)
        )
