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
from dataclasses import dataclass, field
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

# A rank is named when its busy time (every phase but communication, the waiting in
# collectives) is this much above the median of the others' (0.5: half as long again), and,
# where every rank of every window looked at says when it entered its collectives (protocol
# 1.14, issue 33), when it is also the one that comes to them last. Synchronous methods give
# every rank the same wall time per step, so a rank's busy time tells the slow rank apart: the
# others wait for it in their collectives; and who arrives last does not even out either.
# Measured side by side on tests/test_stragglers.py's paused rank (2.5x slower) and its even
# run (the closing note of issue 33), busy time separates them better than arrival alone: a
# rank late by d at each of a step's collectives of T seconds is d / (T - d) slower only where
# they come at the step's end, and the early ones of a step find it less late; arrival read as
# busy time's check, not its stand-in, keeps a rank busy by noise from being named while
# another is the one the collectives wait for, and says by how much it comes after them.
# Noise between even ranks on a shared machine stays within some 20% here; a rank sharing its
# core with another process doubles.
STRAGGLER_THRESHOLD: Final = 0.5
# A rank already named stays named while it is still the slowest and this much slower: a rank
# hovering about the threshold is named once, not named and cleared in turn.
STRAGGLER_KEPT: Final = 0.25
# The latest step events looked at: the straggler is the slowest over them, since_step where its
# latest unbroken run of slow windows began.
STRAGGLER_WINDOWS: Final = 20
_BUSY: Final = tuple(name for name in PHASES if name != "communication")
_ARRIVAL: Final = re.compile(r"^rank/(\d+)/(arrived_late_seconds|collectives)$")


class Straggler(TypedDict):
    rank: int
    slower_by: float  # its busy time over the median of the other ranks', minus 1
    since_step: int  # the step of the first window of its latest unbroken run of slow windows
    # How late it entered each collective, on average over the windows, after the others
    # (seconds); None where the ranks do not say it (runs before 1.14, pipeline stages).
    late_seconds: float | None


@dataclass
class _Window:
    """One step event's figures per rank: busy seconds, seconds late at each collective on
    average, and the collectives entered."""

    busy: dict[int, float] = field(default_factory=dict)
    late: dict[int, float] = field(default_factory=dict)
    collectives: dict[int, float] = field(default_factory=dict)

    def add(self, rank: int, name: str, value: float) -> None:
        """A busy phase's seconds (added up), or one of the arrival's figures."""
        if name == "arrived_late_seconds":
            self.late[rank] = value
        elif name == "collectives":
            self.collectives[rank] = value
        else:
            self.busy[rank] = self.busy.get(rank, 0.0) + value


def _by_arrival(windows: list[_Window]) -> bool:
    """Every window has every rank's arrival (1.14), of two ranks or more."""
    return all(
        len(w.busy) >= 2 and set(w.late) == set(w.busy) == set(w.collectives) for w in windows
    )


def _median_of_others(values: dict[int, float], rank: int) -> float:
    others = sorted(v for r, v in values.items() if r != rank)
    middle = len(others) // 2
    return others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2


def _slower(windows: list[_Window]) -> dict[int, float]:
    """Each rank's busy time over ``windows`` over the median of the others', minus 1."""
    total: dict[int, float] = {}
    for window in windows:
        for rank, busy in window.busy.items():
            total[rank] = total.get(rank, 0.0) + busy
    return {
        r: busy / median - 1 if (median := _median_of_others(total, r)) > 0 else 0.0
        for r, busy in total.items()
    }


def _late(windows: list[_Window]) -> dict[int, float]:
    """How late each rank entered each collective, on average over ``windows``, after the
    others (1.14's windows only)."""
    late = {}
    for rank in windows[0].busy:
        count = sum(w.collectives[rank] for w in windows)
        late[rank] = sum(w.late[rank] * w.collectives[rank] for w in windows) / max(count, 1)
    return late


def _straggler_windows(*, experiment: Experiment) -> dict[int, _Window]:
    """The latest STRAGGLER_WINDOWS step events' figures, step -> window, the warm-up's left
    out (_warm_up_step)."""
    windows = SeriesPoint.objects.filter(experiment_id=experiment.pk, key="rank/0/other_seconds")
    first_two = list(windows.order_by("step").values_list("step", flat=True)[:2])
    warm_up = _warm_up_step(first_two)
    steps = [
        step
        for step in windows.order_by("-step").values_list("step", flat=True)[:STRAGGLER_WINDOWS]
        if step != warm_up
    ]
    points = SeriesPoint.objects.filter(
        experiment_id=experiment.pk, key__startswith="rank/", step__in=steps
    ).values_list("key", "step", "value")
    windows = {step: _Window() for step in steps}
    for key, step, value in points:
        if (found := _KEY.match(key)) and found[2] in _BUSY:
            windows[step].add(int(found[1]), found[2], max(value or 0.0, 0.0))
        elif (found := _ARRIVAL.match(key)) and value is not None:
            windows[step].add(int(found[1]), found[2], value)
    return windows


def experiment_straggler(*, experiment: Experiment, named: int | None = None) -> Straggler | None:
    """The rank markedly slower than the others over the latest windows, or None; ``named``,
    the rank the run names now, stays named down to STRAGGLER_KEPT (another rank slowest
    clears it: the banner names the slowest)."""
    windows = _straggler_windows(experiment=experiment)
    newest_first = [windows[step] for step in sorted(windows, reverse=True)]
    if len({rank for w in newest_first for rank in w.busy}) < 2:
        return None
    slower = _slower(newest_first)
    rank = max(slower, key=lambda r: slower[r])
    bar = STRAGGLER_KEPT if rank == named else STRAGGLER_THRESHOLD
    late = _late(newest_first) if _by_arrival(newest_first) else None
    if slower[rank] <= bar or (late is not None and not _last(late, rank)):
        return None
    since = max(windows)
    for step in sorted(windows, reverse=True):  # newest first: back while the window was slow
        window = windows[step]
        if rank not in window.busy or _slower([window]).get(rank, 0.0) <= bar:
            break
        since = step
    return Straggler(
        rank=rank, slower_by=round(slower[rank], 3), since_step=since,
        late_seconds=None if late is None else round(late[rank], 4),
    )  # fmt: skip


def _warm_up_step(first_two: list[int]) -> int | None:
    """The step of the run's warm-up window, or None where it has none: its first window where
    it covers fewer steps than the next (or no next has come yet). The engine reports step 1
    alone, so that the page has a point at once, and that step carries the cold start (the
    allocator's first blocks, the process group's first connections, caches filled): a rank
    slow there is no straggler (issue 34 item 8: one was named at step 1, cleared at step 10).
    Where every window covers as many steps as the first (one a step) it is a window like the
    others."""
    if not first_two:
        return None
    if len(first_two) == 1:
        return first_two[0]
    first, second = first_two
    return first if first < second - first else None


def _last(late: dict[int, float], rank: int) -> bool:
    """``rank`` comes to the collectives after every other rank, on average."""
    return late[rank] > 0 and late[rank] == max(late.values())
