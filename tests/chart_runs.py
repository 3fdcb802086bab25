"""Runs with many stored series points, made directly in the database (no training): what the
chart tests draw. Called inside the test stack's own database through `manage.py shell`."""

from __future__ import annotations

import datetime
import math

from django.contrib.auth import get_user_model
from django.utils import timezone

from dashboard.experiments.models import Experiment, SeriesPoint, Status

SPIKE_VALUE = 50.0
SECONDS_PER_STEP = 0.01


def _loss(step: int, points: int) -> float:
    # A falling curve with a little noise, always well below the spike.
    return 2.0 * math.exp(-3.0 * step / points) + 0.05 + 0.02 * math.sin(step)


def chart_run_make(
    *,
    owner: str,
    name: str,
    points: int,
    spike_step: int | None = None,
    strategy: str = "single",
    processes: int = 1,
    global_batch: int = 64,
) -> int:
    """A finished run with `points` train_loss and images/s points (a spike of SPIKE_VALUE in
    train_loss at spike_step), test figures ten times, and per-rank images/s."""
    started = timezone.now() - datetime.timedelta(seconds=points * SECONDS_PER_STEP + 60)
    experiment = Experiment.objects.create(
        owner=get_user_model().objects.get(username=owner),
        name=name,
        status=Status.SUCCEEDED,
        strategy=strategy,
        processes=processes,
        batch_size=global_batch // processes,
        started_at=started,
        finished_at=started + datetime.timedelta(seconds=points * SECONDS_PER_STEP),
        step=points,
        total_steps=points,
        run_info={"global_batch_size": global_batch, "world_size": processes},
    )
    rows = []
    for step in range(1, points + 1):
        time = step * SECONDS_PER_STEP
        loss = SPIKE_VALUE if step == spike_step else _loss(step, points)
        rows.append(
            SeriesPoint(experiment=experiment, key="train_loss", step=step, time=time, value=loss)
        )
        rows.append(
            SeriesPoint(
                experiment=experiment,
                key="images_per_second",
                step=step,
                time=time,
                value=900.0 + step % 50,
            )
        )
        if step % max(1, points // 10) == 0:
            for key, value in (
                ("test_loss", _loss(step, points)),
                ("test_accuracy", 0.5 + step / points / 2.1),
            ):
                rows.append(
                    SeriesPoint(experiment=experiment, key=key, step=step, time=time, value=value)
                )
            for rank in range(processes):
                key = f"rank/{rank}/images_per_second"
                rows.append(
                    SeriesPoint(
                        experiment=experiment,
                        key=key,
                        step=step,
                        time=time,
                        value=400.0 + rank * 30,
                    )
                )
    SeriesPoint.objects.bulk_create(rows, batch_size=10000)
    return experiment.pk


# The engine's windows for --log-interval 20 over three epochs of 47 steps (training/engine.py:
# step 1 alone, every 20th step, each epoch's last): 1, 19, 20, 7, 13, 20, 14, 6, 20, 20, 1 steps.
WINDOW_ENDS = (1, 20, 40, 47, 60, 80, 94, 100, 120, 140, 141)
COMPUTE_PER_STEP = 0.01


def window_run_make(*, owner: str, name: str, start: int = 0) -> int:
    """A finished run whose step events are WINDOW_ENDS': compute_seconds sums
    COMPUTE_PER_STEP over each window's steps, images/s is the same in every window. With a
    `start`, the windows after step 1's, shifted by it: a line whose first point is not at the
    start of the run (an imported log, a script joined late)."""
    ends = WINDOW_ENDS if not start else [start + end for end in WINDOW_ENDS[1:]]
    experiment = Experiment.objects.create(
        owner=get_user_model().objects.get(username=owner),
        name=name,
        status=Status.SUCCEEDED,
        started_at=timezone.now() - datetime.timedelta(minutes=5),
        finished_at=timezone.now(),
        step=ends[-1],
        total_steps=ends[-1],
    )
    rows, prev = [], start
    for end in ends:
        time = end * SECONDS_PER_STEP
        for key, value in (
            ("compute_seconds", COMPUTE_PER_STEP * (end - prev)),
            ("images_per_second", 1000.0),
        ):
            rows.append(
                SeriesPoint(experiment=experiment, key=key, step=end, time=time, value=value)
            )
        prev = end
    SeriesPoint.objects.bulk_create(rows)
    return experiment.pk
