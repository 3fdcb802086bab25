"""Runs with stored phase points (protocol 1.9's rank/<r>/<phase>_seconds and bytes), made
directly in the database as the sink stores them: what the phase views' tests read and draw.
Called in-process by tests/test_phase_views.py and inside the test stack's database through
`manage.py shell` by tests/test_phase_views_browser.py."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from dashboard.experiments.models import Experiment, SeriesPoint, Status

WINDOW_STEPS = 10
# Two ranks' seconds per window: rank 1 is slow (its forward and backward take longer), so rank
# 0 waits for it in communication: 0.30 s against rank 1's 0.12 s of a 1 s window.
RANK_SECONDS: dict[int, dict[str, float]] = {
    0: {"data": 0.10, "forward": 0.20, "backward": 0.30, "optimizer": 0.05,
        "communication": 0.30, "other": 0.05},
    1: {"data": 0.08, "forward": 0.30, "backward": 0.40, "optimizer": 0.05,
        "communication": 0.12, "other": 0.05},
}  # fmt: skip
BYTES_PER_STEP = 2_000_000
# The last window differs (data twice as long for every rank): the bars show it, not the mean.
LAST_DATA = 0.5


def phase_points_add(
    experiment: Experiment, *, windows: int, ranks: dict[int, dict[str, float]] = RANK_SECONDS
) -> None:
    """`windows` step events' phases of each rank (every WINDOW_STEPS steps), the last one's
    data LAST_DATA seconds, and BYTES_PER_STEP sent per step by every rank."""
    points = []
    for window in range(1, windows + 1):
        step = window * WINDOW_STEPS
        for rank, seconds in ranks.items():
            values = {f"{name}_seconds": value for name, value in seconds.items()}
            if window == windows:
                values["data_seconds"] = LAST_DATA
            values["communication_bytes"] = BYTES_PER_STEP * WINDOW_STEPS
            points += [
                SeriesPoint(
                    experiment=experiment, key=f"rank/{rank}/{field}", step=step,
                    time=float(window), value=value,
                )
                for field, value in values.items()
            ]  # fmt: skip
    SeriesPoint.objects.bulk_create(points)


def phase_run_make(*, owner: str, name: str, windows: int = 0, **fields: Any) -> int:
    """A finished DDP x2 run with `windows` windows of phase points (none: a run from before
    protocol 1.9); its id."""
    started = timezone.now() - datetime.timedelta(minutes=5)
    experiment = Experiment.objects.create(
        owner=get_user_model().objects.get(username=owner),
        name=name,
        status=Status.SUCCEEDED,
        strategy="ddp",
        processes=2,
        started_at=started,
        finished_at=started + datetime.timedelta(seconds=windows + 1),
        step=windows * WINDOW_STEPS,
        total_steps=windows * WINDOW_STEPS,
        run_info={"world_size": 2, "global_batch_size": 128},
        **fields,
    )
    if windows:
        phase_points_add(experiment, windows=windows)
    return experiment.pk
