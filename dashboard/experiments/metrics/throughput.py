"""A run's throughput: one definition for every place that shows it (issue 34 item 2).

The run page's headline figure, its Scaling card (and the compare page's and a study's
speedups) and each rank's row of its Ranks table once said three things: the latest window's
images/s (short at an epoch's end, so it read low after a reload), the mean of the step events'
figures (a short window counts as much as a long one) and each rank's latest window. Now each is
the images trained over the wall time of the step windows that trained them, over the training
so far: start-up, evaluation and checkpoints are left out, every window weighs as much as the
time it took. A step event says its window's images/s (all ranks together, and each rank's:
protocol 1.1) at its last step; its window is the steps since the previous event, so

    throughput = sum(steps of each window) / sum(steps of each window / its images/s)

the global batch (images a step) cancelling out. A run with no step event (a --dry-run) is read
the same way from its epoch events' figures. A language model's tokens/s (protocol 1.15: its
windows a second x the window's bytes) is the same figure over its own series, so that it is
the images/s figure x the window, whichever one a page shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from django.db.models import Q

from dashboard.experiments.models import SeriesPoint

# What the figure is, where it is shown: the pages take these words from here.
THROUGHPUT_TITLE: Final = "Throughput so far"
THROUGHPUT_RULE: Final = (
    "Throughput: the images trained over the wall time of the steps that trained them, so far "
    "(start-up, evaluation and checkpoints left out); the run's, and each rank's alike."
)
RUN_KEY: Final = "images_per_second"
EPOCH_KEY: Final = "epoch/images_per_second"
TOKENS_KEY: Final = "tokens_per_second"  # a language model's (series_contract.STEP_SERIES)
EPOCH_TOKENS_KEY: Final = "epoch/tokens_per_second"
# Which series a run's figure is read from: its steps', else its epochs'.
KEYS: Final = {False: (RUN_KEY, EPOCH_KEY), True: (TOKENS_KEY, EPOCH_TOKENS_KEY)}
_RANK_KEY: Final = re.compile(r"^rank/(\d+)/images_per_second$")


@dataclass
class _Sum:
    last_step: int = 0
    steps: float = 0.0
    seconds_a_batch: float = 0.0  # sum of steps / images/s: the wall time over the global batch

    def add(self, step: int, value: float | None) -> None:
        covered = step - self.last_step
        if covered <= 0:  # a step already counted (a resumed attempt going over it again)
            return
        self.last_step = step
        if value is not None and value > 0:
            self.steps += covered
            self.seconds_a_batch += covered / value

    def value(self) -> float | None:
        return self.steps / self.seconds_a_batch if self.seconds_a_batch > 0 else None


@dataclass
class Throughput:
    """The running figure of each series (the run's key, each rank's), point after point."""

    sums: dict[str, _Sum] = field(default_factory=dict)

    def add(self, key: str, step: int, value: float | None) -> None:
        self.sums.setdefault(key, _Sum()).add(step, value)

    def of(self, key: str = RUN_KEY) -> float | None:
        found = self.sums.get(key)
        return None if found is None else found.value()

    def ranks(self) -> dict[int, float]:
        """Each rank's figure, by rank."""
        found = {}
        for key, summed in self.sums.items():
            if (rank := _RANK_KEY.match(key)) and (value := summed.value()) is not None:
                found[int(rank[1])] = value
        return found


def throughput_of(points: Iterable[tuple[int, float | None]]) -> float | None:
    """The figure of (step, images/s) points in step order."""
    summed = Throughput()
    for step, value in points:
        summed.add(RUN_KEY, step, value)
    return summed.of()


def throughputs_read(*, experiment_ids: Iterable[int], tokens: bool = False) -> dict[int, float]:
    """Each run's figure from its step events (its epoch events where it has none); a run with
    neither has no entry. ``tokens``: its tokens/s (a language model's), not its images/s."""
    ids = set(experiment_ids)
    step_key, epoch_key = KEYS[tokens]
    found = _read(experiment_ids=ids, key=step_key)
    missing = ids - found.keys()
    if missing:  # the epochs' own series (series_contract.EPOCH_SERIES)
        found.update(_read(experiment_ids=missing, key=epoch_key))
    return found


def _read(*, experiment_ids: set[int], key: str) -> dict[int, float]:
    points = (
        SeriesPoint.objects.filter(experiment_id__in=experiment_ids, key=key)
        .order_by("experiment_id", "step", "id")
        .values_list("experiment_id", "step", "value")
    )
    sums: dict[int, Throughput] = {}
    for experiment_id, step, value in points.iterator(chunk_size=5000):
        sums.setdefault(experiment_id, Throughput()).add(key, step, value)
    return {pk: value for pk, summed in sums.items() if (value := summed.of(key)) is not None}


def run_throughput_read(*, experiment_id: int) -> Throughput:
    """The run's and each rank's running figures from its stored step events."""
    summed = Throughput()
    keys = Q(key__in=(*KEYS[False], *KEYS[True])) | Q(
        key__startswith="rank/", key__endswith="/images_per_second"
    )
    points = (
        SeriesPoint.objects.filter(keys, experiment_id=experiment_id)
        .order_by("step", "id")
        .values_list("key", "step", "value")
    )
    for key, step, value in points.iterator(chunk_size=5000):
        summed.add(key, step, value)
    return summed


def run_figure(summed: Throughput, *, tokens: bool = False) -> float | None:
    """The run's figure: its step events', else its epoch events' (a --dry-run); ``tokens``:
    its tokens/s."""
    step_key, epoch_key = KEYS[tokens]
    found = summed.of(step_key)
    return found if found is not None else summed.of(epoch_key)


def rank_stats_so_far(stats: Mapping[str, Any], *, ranks: Mapping[int, float]) -> dict[str, Any]:
    """``stats`` (a RankStats: the latest window's) with each rank's images/s over the training
    so far, where known: the Ranks table's figure is the run's definition too."""
    rows: Sequence[Any] = stats.get("ranks") or []
    return {
        **stats,
        "ranks": [
            {**row, "images_per_second": round(ranks[row["rank"]], 1)}
            if isinstance(row, dict) and row.get("rank") in ranks
            else row
            for row in rows
        ],
    }
