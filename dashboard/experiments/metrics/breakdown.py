"""Where each rank's time went over the run so far: the read JSON's ``breakdown``.

Each step event's ranks report the seconds of their window in six phases (protocol 1.9,
training/observe/phases.py: data, forward, backward, optimizer, communication, other), which
together make the rank's wall time of the window; the sink stores them as rank/<r>/<phase>_seconds.
Summed per rank over the run (in SQL, one grouped query: the points never come to Python), each
phase's share of their total is the share of the rank's wall time. A run from before 1.9 has no
phases: an empty list.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, TypedDict

from django.db.models import Sum

from dashboard.experiments.models import Experiment, SeriesPoint

# The phases, in the order they are shown, as the shares' names: the web side's one home for them
# (the API's schema is made from it). training/observe/phases.py names the same six for the engine;
# the web server does not import that module, which imports torch, so the event protocol (1.9) is
# what ties the two lists, and tests/test_phases.py checks they agree.
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
    return experiments_breakdown(experiment_ids=[experiment.pk]).get(experiment.pk, [])


def experiments_breakdown(*, experiment_ids: Sequence[int]) -> dict[int, list[RankBreakdown]]:
    """experiment_breakdown of many runs in one grouped query (the compare page's and a
    study's runs: not one query per run); a run with no phases has no entry."""
    sums = (
        SeriesPoint.objects.filter(
            experiment_id__in=list(experiment_ids), key__startswith="rank/",
            key__endswith="_seconds",
        )
        .values("experiment_id", "key")
        .annotate(total=Sum("value"))
    )  # fmt: skip
    seconds: dict[int, dict[int, dict[str, float]]] = {}  # run -> rank -> phase -> seconds
    for row in sums:
        found = _KEY.match(row["key"])
        if found and found[2] in PHASES:
            ranks = seconds.setdefault(row["experiment_id"], {})
            ranks.setdefault(int(found[1]), {})[found[2]] = max(row["total"] or 0.0, 0.0)
    found_runs = {pk: _rank_shares(ranks) for pk, ranks in seconds.items()}
    return {pk: entries for pk, entries in found_runs.items() if entries}


def _rank_shares(seconds: dict[int, dict[str, float]]) -> list[RankBreakdown]:
    entries: list[RankBreakdown] = []
    for rank in sorted(seconds):
        phases = seconds[rank]
        wall = sum(phases.get(name, 0.0) for name in PHASES)
        if "other" not in phases or wall <= 0:  # data_seconds alone: a run from before 1.9
            continue
        shares = {name: round(phases.get(name, 0.0) / wall, 4) for name in PHASES}
        entries.append(RankBreakdown(rank=rank, **shares))  # type: ignore[typeddict-item]
    return entries


# --- the straggler ------------------------------------------------------------------------

# A rank is named when its busy time is this much above the median of the others' (0.5: half
# as long again). Synchronous methods give every rank the same wall time per step, so a rank's
# busy time (every phase but communication, the waiting in collectives) tells the slow rank
# apart: the others wait for it in their collectives. Noise between even ranks on a shared
# machine stays within some 20% here; a rank sharing its core with another process doubles.
STRAGGLER_THRESHOLD: Final = 0.5
# A rank already named stays named while it is still the slowest and this much slower: a rank
# hovering about the threshold is named once, not named and cleared in turn.
STRAGGLER_KEPT: Final = 0.25
# The latest step events looked at: the straggler is the slowest over them, since_step where its
# latest unbroken run of slow windows began.
STRAGGLER_WINDOWS: Final = 20
_BUSY: Final = tuple(name for name in PHASES if name != "communication")


class Straggler(TypedDict):
    rank: int
    slower_by: float  # its busy time over the median of the other ranks', minus 1
    since_step: int  # the step of the first window of its latest unbroken run of slow windows


def _slower_by(busy: dict[int, float], rank: int) -> float:
    others = sorted(v for r, v in busy.items() if r != rank)
    middle = len(others) // 2
    median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
    return busy[rank] / median - 1 if median > 0 else 0.0


def _candidate(total: dict[int, float], named: int | None) -> tuple[int, float] | None:
    """The slowest rank and the bar its windows must pass: the threshold, or the lower bar when
    it is the rank already named (another rank slowest clears it: the banner names the slowest).
    Its since_step is judged by the same bar, so a kept rank's can be earlier than the step its
    naming said."""
    rank = max(total, key=lambda r: _slower_by(total, r))
    bar = STRAGGLER_KEPT if rank == named else STRAGGLER_THRESHOLD
    return (rank, bar) if _slower_by(total, rank) > bar else None


def experiment_straggler(*, experiment: Experiment, named: int | None = None) -> Straggler | None:
    """The rank markedly slower than the others over the latest windows, or None; ``named``,
    the rank the run names now, stays named down to STRAGGLER_KEPT."""
    steps = list(
        SeriesPoint.objects.filter(experiment_id=experiment.pk, key="rank/0/other_seconds")
        .order_by("-step")
        .values_list("step", flat=True)[:STRAGGLER_WINDOWS]
    )
    if not steps:
        return None
    points = SeriesPoint.objects.filter(
        experiment_id=experiment.pk, key__startswith="rank/", key__endswith="_seconds",
        step__gte=min(steps),
    ).values_list("key", "step", "value")  # fmt: skip
    windows: dict[int, dict[int, float]] = {}  # step -> rank -> busy seconds
    for key, step, value in points:
        found = _KEY.match(key)
        if found and found[2] in _BUSY and step in steps:
            busy = windows.setdefault(step, {})
            busy[int(found[1])] = busy.get(int(found[1]), 0.0) + max(value or 0.0, 0.0)
    total: dict[int, float] = {}
    for busy in windows.values():
        for rank, seconds in busy.items():
            total[rank] = total.get(rank, 0.0) + seconds
    if len(total) < 2:
        return None
    candidate = _candidate(total, named)
    if candidate is None:
        return None
    rank, bar = candidate
    slower_by = _slower_by(total, rank)
    since = steps[0]
    for step in steps:  # newest first: back while the window was slow too
        if rank not in windows.get(step, {}) or _slower_by(windows[step], rank) <= bar:
            break
        since = step
    return Straggler(rank=rank, slower_by=round(slower_by, 3), since_step=since)
