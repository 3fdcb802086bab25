"""Migration 0006 keeps every stored point: each figure of each point becomes a named series."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from dashboard.experiments.models import SeriesPoint

BEFORE = [("experiments", "0005_strategy_choices_from_the_registry")]
AFTER = [("experiments", "0006_series_logs_by_rank_tags")]
DROPPED = [("experiments", "0007_remove_metricpoint")]
FIGURES = ("step", "train_loss", "test_loss", "test_accuracy", "images_per_second", "time")


def _old_points(executor: MigrationExecutor, experiment_id: int) -> Any:
    """Two points as the old sink wrote them: a step's, then its epoch's (no train loss)."""
    old = executor.loader.project_state(BEFORE).apps.get_model("experiments", "MetricPoint")
    old.objects.bulk_create(
        [
            old(experiment_id=experiment_id, seq=1, step=1, epoch=1, train_loss=2.5,
                images_per_second=100.0, time=0.5),
            old(experiment_id=experiment_id, seq=2, step=10, epoch=1, train_loss=None,
                test_loss=0.4, test_accuracy=0.9, images_per_second=120.0, time=3.0),
        ]
    )  # fmt: skip
    return old


def _migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor


@pytest.mark.django_db(transaction=True)
def test_existing_points_become_series(user_factory: Any, experiment_factory: Any) -> None:
    experiment = experiment_factory(owner=user_factory())
    executor = _migrate(BEFORE)
    try:
        old = _old_points(executor, experiment.pk)
        _migrate(AFTER)
        rows = SeriesPoint.objects.filter(experiment=experiment).order_by("key", "step")
        assert [(r.key, r.step, r.time, r.value) for r in rows] == [
            # The epoch point's images/s is the epoch's mean, under the sink's key for it.
            ("epoch/images_per_second", 10, 3.0, 120.0),
            ("images_per_second", 1, 0.5, 100.0),
            ("test_accuracy", 10, 3.0, 0.9),
            ("test_loss", 10, 3.0, 0.4),
            ("train_loss", 1, 0.5, 2.5),
        ]
        # Back: the copies go, the points stay.
        _migrate(BEFORE)
        assert old.objects.filter(experiment_id=experiment.pk).count() == 2
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_points_come_back_as_they_were_through_0007(
    user_factory: Any, experiment_factory: Any
) -> None:
    """Forward to 0007 (MetricPoint dropped) and back: 0007's reverse rebuilds each point with
    its own images/s, the epoch's from epoch/images_per_second."""
    experiment = experiment_factory(owner=user_factory())
    executor = _migrate(BEFORE)
    try:
        before = list(_old_points(executor, experiment.pk).objects.values_list(*FIGURES))
        _migrate(DROPPED)
        executor = _migrate(AFTER)
        back = executor.loader.project_state(AFTER).apps.get_model("experiments", "MetricPoint")
        rows = back.objects.filter(experiment_id=experiment.pk).order_by("seq")
        assert list(rows.values_list(*FIGURES)) == before
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
