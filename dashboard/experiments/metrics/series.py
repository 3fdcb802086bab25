"""A run's series, read back: bucketed for charts, raw for exports, listed by key.

Every figure a run reports is a `SeriesPoint` row (key, step, time, value). A chart never gets
the raw rows of a long run: 100,000 points are megabytes of JSON and seconds of drawing. It gets
at most `budget` buckets per series, each holding the range it covers and the min, max, mean and
last value of its points, so that a single spike in 100,000 points is still drawn (as the max of
its bucket: W&B's "full fidelity" buckets). The bucketing runs in SQL (GROUP BY a bucket index
computed from the step) on SQLite and PostgreSQL alike: the rows never come to Python.

The JSON form of one series (the metrics API's and the snapshot's, see messages.py):

    {"count": <raw points in range>,
     "buckets": [[step_first, step_last, time_first, time_last, min, max, mean, last, n], ...]}

`n` counts the bucket's points; min, max, mean and last are over its non-null values (null
where it has none). A series with no more raw points than the budget gets one bucket per point.
Buckets are by step, not time: machine and GPU samples taken while one step lasts (a long
evaluation) all fall in one bucket, however long it took.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypedDict

from django.db.models import (
    Avg,
    BigIntegerField,
    Case,
    Count,
    ExpressionWrapper,
    F,
    Max,
    Min,
    QuerySet,
    Value,
    When,
)
from django.db.models.functions import Cast

from dashboard.experiments.models import Experiment, SeriesPoint

# What a point may hold: a step is a PositiveIntegerField (this is its bound on PostgreSQL), a
# key as long as its column. The import and the metrics route check against these.
MAX_STEP = 2**31 - 1
MAX_KEY_CHARS = SeriesPoint._meta.get_field("key").max_length or 200
DEFAULT_BUDGET = 1000
MAX_BUDGET = 2000
RAW_PAGE_ROWS = 10_000
# Rows named in one IN (...) list: far below SQLite's limit on a statement's variables.
IN_CHUNK = 500
# Snapshots kept by this process (a long run's is ~100 KB a series): the page embeds one and its
# socket sends the same a moment later, and a finished run's never changes.
SNAPSHOT_CACHE_SIZE = 8
_snapshots: OrderedDict[tuple[Any, ...], dict[str, SeriesBuckets]] = OrderedDict()
_snapshots_lock = threading.Lock()

# [step_first, step_last, time_first, time_last, min, max, mean, last, n]
Bucket = list[Any]


class SeriesBuckets(TypedDict):
    count: int  # raw points in the range asked for
    buckets: list[Bucket]


@dataclass(frozen=True)
class SeriesPage:
    """One page of raw points, by step: `next_after` is the `after_step` of the next page."""

    series: dict[str, list[list[Any]]]  # key -> [[step, time, value], ...]
    next_after: int | None


def _points(*, experiment: Experiment, keys: list[str] | None) -> QuerySet[SeriesPoint]:
    points = SeriesPoint.objects.filter(experiment_id=experiment.pk)
    return points if keys is None else points.filter(key__in=keys)


def _in_range(points: QuerySet[SeriesPoint], step_range: tuple[int, int] | None) -> Any:
    if step_range is None:
        return points
    return points.filter(step__gte=step_range[0], step__lte=step_range[1])


def series_keys(*, experiment: Experiment) -> list[str]:
    """The names of the run's series, sorted."""
    keys = _points(experiment=experiment, keys=None).values_list("key", flat=True).distinct()
    return sorted(keys)


def series_buckets(
    *,
    experiment: Experiment,
    keys: list[str] | None = None,
    budget: int = DEFAULT_BUDGET,
    step_range: tuple[int, int] | None = None,
) -> dict[str, SeriesBuckets]:
    """Each series (of `keys`, or all) in at most `budget` buckets by step, over `step_range`
    (inclusive; None for the whole run): a zoom asks for finer buckets of its range."""
    budget = max(1, min(budget, MAX_BUDGET))
    points = _in_range(_points(experiment=experiment, keys=keys), step_range)
    # One query for every key's size and step range (the index serves it key by key).
    sizes = points.values("key").annotate(n=Count("id"), lo=Min("step"), hi=Max("step"))
    found: dict[str, SeriesBuckets] = {}
    small = [row["key"] for row in sizes if row["n"] <= budget]
    if small:
        found.update(_one_per_point(points.filter(key__in=small)))
    for row in sizes:
        if row["n"] > budget:
            span = row["hi"] - row["lo"] + 1
            buckets = _grouped(
                points.filter(key=row["key"]), lo=row["lo"], span=span, budget=budget
            )
            found[row["key"]] = {"count": row["n"], "buckets": buckets}
    return {key: found[key] for key in sorted(found)}


def series_snapshot(*, experiment: Experiment) -> dict[str, SeriesBuckets]:
    """Every series at the default budget, as the run page's snapshot carries them; computed
    once per stored state of the run (every point stored comes with a message, so with a new
    last seq; a resumed attempt deletes points under a new attempt number), so the page and its
    socket share one computation. The creation time tells apart rows that reuse an id."""
    stamp = (experiment.pk, experiment.created_at, experiment.last_seq, experiment.attempt)
    with _snapshots_lock:
        if stamp in _snapshots:
            _snapshots.move_to_end(stamp)
            return _snapshots[stamp]
    found = series_buckets(experiment=experiment)
    with _snapshots_lock:
        _snapshots[stamp] = found
        while len(_snapshots) > SNAPSHOT_CACHE_SIZE:
            _snapshots.popitem(last=False)
    return found


def _one_per_point(points: QuerySet[SeriesPoint]) -> dict[str, SeriesBuckets]:
    found: dict[str, SeriesBuckets] = {}
    for key, step, time, value in points.order_by("key", "step", "id").values_list(
        "key", "step", "time", "value"
    ):
        series = found.setdefault(key, {"count": 0, "buckets": []})
        series["count"] += 1
        series["buckets"].append([step, step, time, time, value, value, value, value, 1])
    return found


def _grouped(points: QuerySet[SeriesPoint], *, lo: int, span: int, budget: int) -> list[Bucket]:
    """Buckets of equal step width: index = (step - lo) * budget // span, in SQL. A bigint
    first: step x budget outgrows PostgreSQL's integer past a million steps."""
    index = ExpressionWrapper(
        (Cast(F("step"), BigIntegerField()) - Value(lo)) * Value(budget) / Value(span),
        output_field=BigIntegerField(),
    )
    valued_step = Case(When(value__isnull=False, then=F("step")), default=None)
    rows = list(
        points.annotate(bucket=index)
        .values("bucket")
        .annotate(
            step_first=Min("step"),
            step_last=Max("step"),
            time_first=Min("time"),
            time_last=Max("time"),
            low=Min("value"),
            high=Max("value"),
            mean=Avg("value"),
            n=Count("id"),
            last_step=Max(valued_step),
        )
        .order_by("bucket")
    )
    last = _values_at(points, steps=[r["last_step"] for r in rows if r["last_step"] is not None])
    return [
        [r["step_first"], r["step_last"], r["time_first"], r["time_last"], r["low"], r["high"],
         _short(r["mean"]), last.get(r["last_step"]), r["n"]]
        for r in rows
    ]  # fmt: skip


def _short(mean: float | None) -> float | None:
    # A mean is computed, not stored: 7 significant digits say it, in half the JSON of 17.
    return None if mean is None else float(f"{mean:.7g}")


def _values_at(points: QuerySet[SeriesPoint], *, steps: list[int]) -> dict[int, float]:
    """The non-null value at each of `steps` (the newest row where a step has several)."""
    found: dict[int, float] = {}
    for start in range(0, len(steps), IN_CHUNK):
        rows = (
            points.filter(step__in=steps[start : start + IN_CHUNK], value__isnull=False)
            .order_by("step", "id")
            .values_list("step", "value")
        )
        found.update(rows)  # ordered by id within a step: the newest wins
    return found


def series_raw(
    *,
    experiment: Experiment,
    keys: list[str] | None,
    after_step: int | None,
    limit: int = RAW_PAGE_ROWS,
) -> SeriesPage:
    """Raw points by step, `limit` rows a page or so: a page ends at a whole step, so that
    `after_step` cuts no step in two (a step holding more rows than `limit` comes whole)."""
    limit = max(1, limit)
    points = _points(experiment=experiment, keys=keys)
    if after_step is not None:
        points = points.filter(step__gt=after_step)
    ordered = points.order_by("step", "key", "id").values_list("step", "key", "time", "value")
    rows = list(ordered[: limit + 1])
    next_after: int | None = None
    if len(rows) > limit:
        last, following = rows[limit - 1][0], rows[limit][0]
        rows = rows[:limit]
        if following == last:  # the page would end inside a step: it ends before it
            rows = [row for row in rows if row[0] != last]
            if not rows:  # one step holds more than a page: it comes whole
                rows = list(ordered.filter(step=last))
        next_after = rows[-1][0]
    series: dict[str, list[list[Any]]] = {}
    for step, key, time, value in rows:
        series.setdefault(key, []).append([step, time, value])
    return SeriesPage(series=series, next_after=next_after)


def series_delete_after(*, experiment: Experiment, step: int) -> int:
    """Remove the points after `step` (a resumed attempt replays those steps); returns how many."""
    removed, _ = SeriesPoint.objects.filter(experiment_id=experiment.pk, step__gt=step).delete()
    return removed
