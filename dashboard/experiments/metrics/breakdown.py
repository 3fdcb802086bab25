"""Where each rank's time went over the run so far: the read JSON's ``breakdown``.

Each step event's ranks report the seconds of their window in six phases (protocol 1.9,
training/phases.py: data, forward, backward, optimizer, communication, other), which together
make the rank's wall time of the window; the sink stores them as rank/<r>/<phase>_seconds.
Summed per rank over the run (in SQL, one grouped query: the points never come to Python), each
phase's share of their total is the share of the rank's wall time. A run from before 1.9 has no
phases: an empty list.
"""

from __future__ import annotations

import re
from typing import Final, TypedDict

from django.db.models import Sum

from dashboard.experiments.models import Experiment, SeriesPoint

# The phases, in the order they are shown, as the shares' names.
PHASES: Final = ("data", "forward", "backward", "optimizer", "communication", "other")
_KEY: Final = re.compile(r"^rank/(\d+)/(\w+)_seconds$")


class RankBreakdown(TypedDict):
    rank: int
    data: float
    forward: float
    backward: float
    optimizer: float
    communication: float
    other: float


def experiment_breakdown(*, experiment: Experiment) -> list[RankBreakdown]:
    """One entry per rank that reported its phases, rank order: each phase's share (0..1) of
    the rank's wall time over the run so far; the shares add up to 1."""
    sums = (
        SeriesPoint.objects.filter(
            experiment_id=experiment.pk, key__startswith="rank/", key__endswith="_seconds"
        )
        .values("key")
        .annotate(total=Sum("value"))
    )
    seconds: dict[int, dict[str, float]] = {}
    for row in sums:
        found = _KEY.match(row["key"])
        if found and found[2] in PHASES:
            seconds.setdefault(int(found[1]), {})[found[2]] = max(row["total"] or 0.0, 0.0)
    entries: list[RankBreakdown] = []
    for rank in sorted(seconds):
        phases = seconds[rank]
        wall = sum(phases.get(name, 0.0) for name in PHASES)
        if "other" not in phases or wall <= 0:  # data_seconds alone: a run from before 1.9
            continue
        shares = {name: round(phases.get(name, 0.0) / wall, 4) for name in PHASES}
        entries.append(RankBreakdown(rank=rank, **shares))  # type: ignore[typeddict-item]
    return entries
