"""A run's checkpoints as rows, and which of them the training's retention has deleted.

The training keeps its last few checkpoint files; the list a page shows must hold only what can
still be fetched, so the worker (whose disk the files are on, maybe not the web server's) stats
them as each new one comes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from dashboard.experiments.models import Checkpoint, Experiment
from dashboard.experiments.runs.bounds import is_count

MAX_PATH_CHARS = 4096  # a path is a TextField: bound what one event can store


def file_size(path: str) -> int | None:
    # Read here, by the worker: the file is on this machine, maybe not on the web server's.
    try:
        return os.stat(path).st_size
    except (OSError, ValueError):
        return None


def checkpoint_row(*, experiment: Experiment, message: dict[str, Any]) -> Checkpoint | None:
    """The row of a checkpoint event, or None when its epoch, step or path is not one."""
    epoch, step, path = message.get("epoch"), message.get("step"), message.get("path")
    if not (is_count(epoch) and is_count(step)):
        return None
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        return None
    return Checkpoint(
        experiment_id=experiment.pk,
        epoch=epoch,
        step=step,
        requested=message.get("requested") is True,
        path=path,
        size=file_size(path),
        worker=experiment.worker,
    )


def checkpoints_gone(
    *, experiment: Experiment, pending: Iterable[Checkpoint], keep_step: int
) -> list[int]:
    """Steps whose files this worker wrote (stored, or `pending` in this flush) and no longer
    has; a step written again (a resumed attempt) counts as present if any copy is."""
    stored = Checkpoint.objects.filter(
        experiment_id=experiment.pk, worker=experiment.worker
    ).values_list("step", "path")
    entries = [*stored, *((c.step, c.path) for c in pending)]
    present = {step for step, path in entries if file_size(path) is not None}
    return sorted({step for step, _ in entries} - present - {keep_step})


class CheckpointsPending:
    """A flush's checkpoint rows, and the steps whose files are gone: the sink keeps them as
    the events come and writes them in its flush's transaction (`store`)."""

    def __init__(self, *, experiment: Experiment) -> None:
        self.experiment = experiment
        self.rows: list[Checkpoint] = []
        self.pruned: set[int] = set()

    def add(self, checkpoint: Checkpoint) -> list[int]:
        """Keep `checkpoint` for the flush; returns the steps whose files are gone: their rows
        go at the flush, so that the list shows what can still be fetched."""
        self.pruned.discard(checkpoint.step)
        self.rows = [c for c in self.rows if c.step != checkpoint.step]
        self.rows.append(checkpoint)
        gone = checkpoints_gone(
            experiment=self.experiment, pending=self.rows, keep_step=checkpoint.step
        )
        self.pruned.update(gone)
        self.rows = [c for c in self.rows if c.step not in self.pruned]
        return gone

    def store(self) -> None:
        """Delete the gone steps' rows and write the new ones (the caller holds the transaction,
        and starts afresh once it has committed)."""
        if self.pruned:
            Checkpoint.objects.filter(
                experiment_id=self.experiment.pk, step__in=self.pruned
            ).delete()
        # A resumed run writes its steps' checkpoints again: the newer file wins.
        Checkpoint.objects.bulk_create(
            # One row per step per statement: PostgreSQL refuses to update a row twice.
            list({c.step: c for c in self.rows}.values()),
            update_conflicts=True,
            unique_fields=["experiment", "step"],
            update_fields=["epoch", "requested", "path", "size", "worker", "created"],
        )
