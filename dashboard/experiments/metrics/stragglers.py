"""The straggler's sentence, with its figures from the stored series: the run log's line, the
run page's banner and the notification all say it in these words (issue 19, part 2).

``breakdown.experiment_straggler`` names the rank (its busy time over the others' median); what
the others did meanwhile is their communication share over the same windows: the time they spent
blocked in collectives, waiting for it, over their wall time.
"""

from __future__ import annotations

from typing import Final

from dashboard.experiments.metrics.breakdown import PHASES, STRAGGLER_WINDOWS, Straggler
from dashboard.experiments.models import Experiment, SeriesPoint

_SECONDS: Final = tuple(f"{name}_seconds" for name in PHASES)


def others_communication_share(*, experiment: Experiment, straggler: Straggler) -> float | None:
    """The ranks other than the straggler: their communication seconds over their wall time
    (the six phases), over the latest STRAGGLER_WINDOWS step windows from its since_step on;
    None without figures."""
    steps = list(
        SeriesPoint.objects.filter(
            experiment_id=experiment.pk, key="rank/0/other_seconds",
            step__gte=straggler["since_step"],
        )
        .order_by("-step")
        .values_list("step", flat=True)[:STRAGGLER_WINDOWS]
    )  # fmt: skip
    if not steps:
        return None
    points = SeriesPoint.objects.filter(
        experiment_id=experiment.pk, key__startswith="rank/", step__in=steps
    ).values_list("key", "value")
    communication = wall = 0.0
    for key, value in points:
        _, rank, name = key.split("/", 2)
        if rank.isdigit() and int(rank) != straggler["rank"] and name in _SECONDS:
            seconds = max(value or 0.0, 0.0)
            wall += seconds
            communication += seconds if name == "communication_seconds" else 0.0
    return communication / wall if wall > 0 else None


def straggler_text(straggler: Straggler, *, others_share: float | None) -> str:
    """ "rank 1 is 2.6x slower than the median since step 340: the others spend 61% of their
    time waiting for it in communication"."""
    text = (
        f"rank {straggler['rank']} is {1 + straggler['slower_by']:.1f}x slower than the median "
        f"since step {straggler['since_step']}"
    )
    if others_share is None:
        return text
    waiting = f"the others spend {others_share:.0%} of their time waiting for it in communication"
    return f"{text}: {waiting}"


def straggler_cleared_text(*, rank: int, step: int) -> str:
    return f"rank {rank} is no longer slower than the others (step {step})"
