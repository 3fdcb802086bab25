"""The straggler's sentence, with its figures from the stored series: the run log's line, the
run page's banner and the notification all say it in these words (issue 19, part 2).

``breakdown.experiment_straggler`` names the rank (its busy time over the others' median); what
the others did meanwhile is their communication share over the same windows: the time they spent
blocked in collectives, waiting for it, over their wall time; and where it spent its extra time,
the busy phase furthest over the others' median (issue 33: "its backward takes 2.1x theirs");
and, where it was named by when it arrives at the collectives, by how much it comes after them.
On a pipeline the ranks are stages of the model, each with its own work: the rank named is the
stage the split gave the most, said as such (issue 34 item 8), not as a slow rank.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Final

from dashboard.experiments.metrics.breakdown import PHASES, STRAGGLER_WINDOWS, Straggler
from dashboard.experiments.models import Experiment, SeriesPoint
from training.registry import strategy_get

_SECONDS: Final = tuple(f"{name}_seconds" for name in PHASES)


@dataclass(frozen=True)
class StragglerContext:
    """What the others did meanwhile (their communication share: the time they spent blocked in
    collectives, waiting for it, over their wall time) and the phase where the straggler spent
    its extra time, with its ratio to the others' median."""

    others_share: float | None
    phase: tuple[str, float | None, float] | None  # name, ratio (None: theirs is 0), seconds over
    # A pipeline's ranks are its stages (each runs its own part of the model): the other
    # stages, where the rank named is one. Its extra time is the split's, not a slow machine's.
    other_stages: tuple[int, ...] | None = None


def run_has_stages(experiment: Experiment) -> bool:
    """Each rank runs a stage of the model (a pipeline): ranks differ by their stage's work."""
    try:
        return strategy_get(experiment.strategy).stages
    except ValueError:  # a strategy the registry no longer has
        return False


def straggler_context(*, experiment: Experiment, straggler: Straggler) -> StragglerContext:
    """Over the latest STRAGGLER_WINDOWS step windows from its since_step on."""
    seconds = _phase_seconds(experiment=experiment, straggler=straggler)
    others = {rank: phases for rank, phases in seconds.items() if rank != straggler["rank"]}
    wall = sum(sum(phases.values()) for phases in others.values())
    waited = sum(phases.get("communication", 0.0) for phases in others.values())
    return StragglerContext(
        others_share=waited / wall if wall > 0 else None,
        phase=_extra_phase(seconds.get(straggler["rank"], {}), list(others.values())),
        other_stages=tuple(sorted(others)) if run_has_stages(experiment) else None,
    )


def _phase_seconds(*, experiment: Experiment, straggler: Straggler) -> dict[int, dict[str, float]]:
    """rank -> phase -> seconds, summed over the windows."""
    steps = list(
        SeriesPoint.objects.filter(
            experiment_id=experiment.pk, key="rank/0/other_seconds",
            step__gte=straggler["since_step"],
        )
        .order_by("-step")
        .values_list("step", flat=True)[:STRAGGLER_WINDOWS]
    )  # fmt: skip
    points = SeriesPoint.objects.filter(
        experiment_id=experiment.pk, key__startswith="rank/", step__in=steps
    ).values_list("key", "value")
    seconds: dict[int, dict[str, float]] = {}
    for key, value in points:
        _, rank, name = key.split("/", 2)
        if rank.isdigit() and name in _SECONDS:
            phases = seconds.setdefault(int(rank), {})
            phase = name.removesuffix("_seconds")
            phases[phase] = phases.get(phase, 0.0) + max(value or 0.0, 0.0)
    return seconds


def _extra_phase(
    mine: dict[str, float], others: list[dict[str, float]]
) -> tuple[str, float | None, float] | None:
    """The busy phase (communication aside: that is the others' waiting) where the straggler
    spent most time over the others' median: its name, its ratio to that median (None where
    theirs is none: a rank paused in the script's own code between steps, which the others
    spend no time in) and the seconds over it."""
    best: tuple[str, float | None, float] | None = None
    for phase in PHASES:
        if phase == "communication" or not others:
            continue
        median = statistics.median(o.get(phase, 0.0) for o in others)
        extra = mine.get(phase, 0.0) - median
        if extra > 0 and (best is None or extra > best[2]):
            best = (phase, mine.get(phase, 0.0) / median if median > 0 else None, extra)
    return best


def straggler_text(straggler: Straggler, *, context: StragglerContext) -> str:
    """ "rank 1 is 2.6x slower than the median since step 340: it reaches each collective 180
    ms after the others; the others spend 61% of their time waiting for it in communication;
    its backward takes 2.1x theirs" (the first clause where it was named by arrival). On a
    pipeline, the stages' imbalance: stage_imbalance_text."""
    if context.other_stages is not None:
        return stage_imbalance_text(straggler, other_stages=context.other_stages)
    text = (
        f"rank {straggler['rank']} is {1 + straggler['slower_by']:.1f}x slower than the median "
        f"since step {straggler['since_step']}"
    )
    said = []
    late = straggler.get("late_seconds")
    if late is not None:
        said.append(f"it reaches each collective {_duration(late)} after the others")
    if context.others_share is not None:
        said.append(f"the others spend {context.others_share:.0%} of their time waiting for it "
                    "in communication")  # fmt: skip
    if context.phase is not None:
        phase, ratio, extra = context.phase
        more = f"{_duration(extra)} more than theirs" if ratio is None else f"{ratio:.1f}x theirs"
        said.append(f"its {phase} takes {more}")
    return f"{text}: {'; '.join(said)}" if said else text


def stage_imbalance_text(straggler: Straggler, *, other_stages: tuple[int, ...]) -> str:
    """ "stage 0 takes 2.3x stage 1: the split is unbalanced" (its busy time over the other
    stages' median): no rank is slow, the model's split gives one stage more work."""
    others = f"stage {other_stages[0]}" if len(other_stages) == 1 else "the other stages"
    return (
        f"stage {straggler['rank']} takes {1 + straggler['slower_by']:.1f}x {others}: the split "
        "is unbalanced"
    )


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def straggler_cleared_text(*, rank: int, step: int, stages: bool = False) -> str:
    if stages:
        return f"stage {rank} no longer takes markedly longer than the others (step {step})"
    return f"rank {rank} is no longer slower than the others (step {step})"
