"""The series store: what the sink records, honest buckets (a spike survives 100,000 points),
zoom, raw pages, the metrics API, a bounded snapshot, live latency, and migration 0007."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from dashboard.devices import facts
from dashboard.experiments.metrics.series import series_buckets, series_keys, series_raw
from dashboard.experiments.models import Experiment, SeriesPoint
from dashboard.experiments.runs import sink as sink_module
from dashboard.experiments.runs.sink import SEND_GAP_SECONDS, EventSink
from dashboard.experiments.selectors import experiment_snapshot_build
from tests.postgres import Postgres
from tests.stack import ROOT

pytestmark = pytest.mark.django_db
SPIKE_STEP, SPIKE = 43_210, 1e6


def spiky_points(experiment_id: int, n: int, *, spike: int = SPIKE_STEP) -> list[SeriesPoint]:
    """`n` train loss points at steps 1..n, values between 1 and 2, the one at `spike` a spike."""
    return [
        SeriesPoint(experiment_id=experiment_id, key="train_loss", step=step, time=step / 10,
                    value=SPIKE if step == spike else 1 + (step % 7) / 7)
        for step in range(1, n + 1)
    ]  # fmt: skip


# A script for a database of another engine: the same calls, the answers printed as JSON.
BUCKETS_SCRIPT = """
import json
from django.contrib.auth.models import User
from dashboard.experiments.models import Experiment, SeriesPoint
from dashboard.experiments.metrics.series import series_buckets
from tests.test_series import spiky_points
owner = User.objects.create_user(username="pg")
run = Experiment.objects.create(owner=owner, name="pg")
SeriesPoint.objects.bulk_create(spiky_points(run.pk, 100_000), batch_size=5000)
whole = series_buckets(experiment=run)["train_loss"]
zoom = series_buckets(experiment=run, step_range=(40_000, 45_000))["train_loss"]
print(json.dumps({"whole": whole, "zoom": zoom}))
"""


def assert_honest(
    series: Any, *, count: int, budget: int, lo: int, hi: int, spike: int = SPIKE_STEP
) -> None:
    """Buckets in step order, disjoint, covering every point once, the spike kept."""
    buckets = series["buckets"]
    assert series["count"] == count == sum(b[8] for b in buckets)
    assert len(buckets) <= budget
    assert buckets[0][0] == lo and buckets[-1][1] == hi
    for before, after in zip(buckets, buckets[1:], strict=False):
        assert before[0] <= before[1] < after[0]
    spiked = [b for b in buckets if b[0] <= spike <= b[1]]
    assert len(spiked) == 1 and spiked[0][5] == SPIKE and spiked[0][4] >= 1
    assert max(b[5] for b in buckets) == SPIKE and min(b[4] for b in buckets) == 1
    assert all(b[4] <= b[6] <= b[5] and b[4] <= b[7] <= b[5] for b in buckets)


def test_a_spike_survives_100k_points_and_a_zoom_gives_finer_buckets(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory())
    SeriesPoint.objects.bulk_create(spiky_points(run.pk, 100_000), batch_size=5000)
    whole = series_buckets(experiment=run)["train_loss"]
    assert_honest(whole, count=100_000, budget=1000, lo=1, hi=100_000)
    assert len(whole["buckets"]) == 1000  # 100 steps each
    last = whole["buckets"][-1]
    assert last[7] == 1 + (100_000 % 7) / 7 and last[3] == 10_000.0  # the value at step_last
    zoom = series_buckets(experiment=run, step_range=(40_000, 45_000))["train_loss"]
    assert_honest(zoom, count=5001, budget=1000, lo=40_000, hi=45_000)
    width = (zoom["buckets"][-1][1] - zoom["buckets"][0][0]) / len(zoom["buckets"])
    assert width < 10  # 5 steps a bucket where the whole run has 100
    fewer = series_buckets(experiment=run, budget=10)["train_loss"]
    assert_honest(fewer, count=100_000, budget=10, lo=1, hi=100_000)


def test_the_same_buckets_on_postgres(postgres_server: Postgres) -> None:
    # The session's server (tests/conftest.py), a database of this test's own.
    env = {"PATH": "/usr/bin:/bin", "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "TRAINYARD_DEBUG": "1",
           "DATABASE_URL": postgres_server.database_create("trainyard_series")}  # fmt: skip
    for args in (["migrate", "--noinput"], ["shell", "-c", BUCKETS_SCRIPT]):
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert_honest(answer["whole"], count=100_000, budget=1000, lo=1, hi=100_000)
    assert_honest(answer["zoom"], count=5001, budget=1000, lo=40_000, hi=45_000)


def test_short_series_come_one_bucket_per_point_nulls_counted(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory())
    SeriesPoint.objects.bulk_create(
        [
            SeriesPoint(experiment=run, key="test_loss", step=20, time=2.0, value=None),
            SeriesPoint(experiment=run, key="test_loss", step=10, time=1.0, value=0.5),
            SeriesPoint(experiment=run, key="lr", step=10, time=1.0, value=0.01),
        ]
    )
    found = series_buckets(experiment=run)
    assert list(found) == ["lr", "test_loss"] == series_keys(experiment=run)
    assert found["test_loss"] == {
        "count": 2,
        "buckets": [[10, 10, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1],
                    [20, 20, 2.0, 2.0, None, None, None, None, 1]],
    }  # fmt: skip
    assert list(series_buckets(experiment=run, keys=["lr"])) == ["lr"]


def test_raw_pages_end_at_whole_steps_and_cover_every_point(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory())
    rows = [SeriesPoint(experiment=run, key=key, step=step, time=step, value=step)
            for step in range(1, 51) for key in ("a", "b", "c")]  # fmt: skip
    # One step with more rows than a page (many ranks at once).
    rows += [SeriesPoint(experiment=run, key=f"rank/{r}/x", step=25, time=25, value=r)
             for r in range(12)]  # fmt: skip
    SeriesPoint.objects.bulk_create(rows)
    seen: list[tuple[str, int]] = []
    after, pages = None, 0
    while True:
        page = series_raw(experiment=run, keys=None, after_step=after, limit=10)
        steps = [{p[0] for p in points} for points in page.series.values()]
        seen += [(key, p[0]) for key, points in page.series.items() for p in points]
        pages += 1
        if page.next_after is None:
            break
        assert all(max(s) <= page.next_after for s in steps)
        after = page.next_after
    assert sorted(seen) == sorted((r.key, r.step) for r in rows) and pages > 10
    only_a = series_raw(experiment=run, keys=["a"], after_step=48, limit=10)
    assert only_a.series == {"a": [[49, 49.0, 49.0], [50, 50.0, 50.0]]}
    assert only_a.next_after is None


def test_metrics_api_bucketed_raw_and_refusals(user_factory: Any, experiment_factory: Any) -> None:
    alice, bob = user_factory(), user_factory()
    run = experiment_factory(owner=alice)
    SeriesPoint.objects.bulk_create(spiky_points(run.pk, 3000, spike=1234))
    client = Client()
    client.force_login(alice)
    url = f"/api/experiments/{run.pk}/metrics/"
    body = client.get(url).json()
    assert body["budget"] == 1000 and body["step_range"] is None
    assert_honest(body["series"]["train_loss"], count=3000, budget=1000, lo=1, hi=3000, spike=1234)
    zoom = client.get(url, {"buckets": "50", "from": "100", "to": "199"}).json()
    assert zoom["step_range"] == [100, 199]
    assert len(zoom["series"]["train_loss"]["buckets"]) == 50
    for bad in ({"buckets": "0"}, {"buckets": "2001"}, {"buckets": "x"},
                {"from": "9", "to": "3"}, {"after": "-5", "raw": "1"}):  # fmt: skip
        assert client.get(url, bad).status_code == 400, bad
    raw = client.get(url, {"raw": "1", "limit": "1000"}).json()
    assert [p[0] for p in raw["series"]["train_loss"]] == list(range(1, 1001))
    following = client.get(raw["next"]).json()
    assert following["series"]["train_loss"][0][0] == 1001 and "limit=1000" in raw["next"]
    client.force_login(bob)
    assert client.get(url).status_code == 404


def test_metrics_api_reads_numbers_as_the_logs_route_does(
    user_factory: Any, experiment_factory: Any
) -> None:
    # One parser (web/params.py): int() read "٣" as 3, "1_0" as 10 and " 5" as 5 here, where
    # the logs route refused them.
    alice = user_factory()
    run = experiment_factory(owner=alice)
    client = Client()
    client.force_login(alice)
    url = f"/api/experiments/{run.pk}/metrics/"
    for bad in ({"buckets": "\u0663"}, {"buckets": "1_0"}, {"from": " 5"}, {"to": "+5"}):
        response = client.get(url, bad)
        assert response.status_code == 400, bad
        [name] = bad
        assert response.json()["errors"] == {name: [bad[name]]}
    assert client.get(url, {"after": "-1", "raw": "1"}).status_code == 200
    # A minus sign only where a negative is allowed: the logs route took digits alone.
    logs = f"/api/experiments/{run.pk}/logs/"
    for bad in ({"after": "-0"}, {"limit": "-0"}):
        assert client.get(logs, bad).status_code == 400, bad
    assert client.get(logs, {"after": "0"}).status_code == 200


def test_the_snapshot_of_a_long_run_stays_small(user_factory: Any, experiment_factory: Any) -> None:
    sizes = {}
    for n in (10_000, 100_000):
        run = experiment_factory(owner=user_factory())
        SeriesPoint.objects.bulk_create(spiky_points(run.pk, n, spike=n // 3), batch_size=5000)
        snapshot = experiment_snapshot_build(experiment=run, log_lines=200)
        assert "points" not in snapshot
        train = snapshot["series"]["train_loss"]
        assert_honest(train, count=n, budget=1000, lo=1, hi=n, spike=n // 3)
        sizes[n] = len(json.dumps(snapshot))
    print(f"\nsnapshot bytes: 10k points {sizes[10_000]}, 100k points {sizes[100_000]}")
    assert sizes[100_000] < 200_000 and sizes[100_000] < 1.2 * sizes[10_000]


RANKS = [{"rank": r, "images_per_second": 10.0 + r, "data_seconds": 0.1, "compute_seconds": 0.2,
          "rss_bytes": 1000 + r} for r in (0, 1)]  # fmt: skip


def test_the_sink_records_every_series(experiment_factory: Any, user_factory: Any) -> None:
    run = experiment_factory(owner=user_factory())
    sink = EventSink(run)
    sink.add({"type": "step", "epoch": 1, "step": 10, "time": 1.0, "train_loss": 2.0,
              "images_per_second": 21.0, "lr": 0.01, "data_seconds": 0.1,
              "compute_seconds": 0.2, "rss_bytes": 1000, "ranks": RANKS})  # type: ignore[typeddict-unknown-key]  # fmt: skip
    sink.add({"type": "epoch", "epoch": 1, "step": 20, "time": 2.0, "train_loss": 1.5,
              "test_loss": 0.3, "test_accuracy": 0.9, "images_per_second": 20.0})  # type: ignore[typeddict-item]  # fmt: skip
    sink.add_series({"machine/w/cpu_percent": 50.0, "gpu/w/0/utilization": math.nan}, time_=2.5)
    sink.flush()
    stored = {(p.key, p.step): p.value for p in SeriesPoint.objects.filter(experiment=run)}
    assert stored == {
        ("train_loss", 10): 2.0, ("images_per_second", 10): 21.0, ("lr", 10): 0.01,
        ("data_seconds", 10): 0.1, ("compute_seconds", 10): 0.2, ("rss_bytes", 10): 1000,
        **{(f"rank/{r['rank']}/{name}", 10): r[name] for r in RANKS
           for name in ("images_per_second", "data_seconds", "compute_seconds", "rss_bytes")},
        ("test_loss", 20): 0.3, ("test_accuracy", 20): 0.9,
        ("epoch/images_per_second", 20): 20.0,  # the epoch's train loss draws no second curve
        # Samples sit at the run's latest step; a value that is not finite is kept as null.
        ("machine/w/cpu_percent", 20): 50.0, ("gpu/w/0/utilization", 20): None,
    }  # fmt: skip


def test_a_sparse_event_leaves_at_once_a_burst_is_coalesced(
    experiment_factory: Any,
    user_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = experiment_factory(owner=user_factory())
    sent: list[int] = []
    sink = EventSink(run)
    monkeypatch.setattr(sink, "_send", lambda messages: sent.append(len(messages)))
    clock = [1000.0]
    monkeypatch.setattr(sink_module.time, "monotonic", lambda: clock[0])
    assert sink.due_in(clock[0]) is None  # nothing to send
    sink.add({"type": "log", "level": "info", "message": "first"})
    assert sink.due_in(clock[0]) == 0  # sparse: at once
    # The test's transaction never commits: run what a commit would (the sink's sends).
    with django_capture_on_commit_callbacks(execute=True):
        sink.flush()
    for step in range(1, 101):  # a burst right behind it: held for the gap, then one message
        sink.add({"type": "step", "epoch": 1, "step": step, "time": step, "train_loss": 1.0})  # type: ignore[typeddict-item]
        assert sink.due_in(clock[0]) == pytest.approx(SEND_GAP_SECONDS)
    clock[0] += SEND_GAP_SECONDS
    assert sink.due_in(clock[0]) == 0
    with django_capture_on_commit_callbacks(execute=True):
        sink.flush()
    clock[0] += 10  # quiet again: the next event leaves at once
    sink.add({"type": "log", "level": "info", "message": "later"})
    assert sink.due_in(clock[0]) == 0
    assert sent == [1, 100]


def test_machine_samples_with_and_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    class Fake:
        NVMLError = facts.pynvml.NVMLError

        @staticmethod
        def nvmlDeviceGetCount() -> int:  # noqa: N802 - NVML's name
            return 2

        @staticmethod
        def nvmlDeviceGetHandleByIndex(index: int) -> int:  # noqa: N802
            return index + 1

        @staticmethod
        def nvmlDeviceGetUtilizationRates(handle: int) -> Any:  # noqa: N802
            return type("U", (), {"gpu": 40 * handle})

        @staticmethod
        def nvmlDeviceGetMemoryInfo(handle: int) -> Any:  # noqa: N802
            return type("M", (), {"used": 2**30 * handle})

    monkeypatch.setattr(facts, "pynvml", Fake)
    monkeypatch.setattr(facts, "_nvml_initialised", True)
    samples = facts.machine_samples_collect(worker="box")
    assert samples.keys() == {"machine/box/cpu_percent", "gpu/box/0/utilization",
                              "gpu/box/0/memory_bytes", "gpu/box/1/utilization",
                              "gpu/box/1/memory_bytes"}  # fmt: skip
    assert samples["gpu/box/1/utilization"] == 80 and samples["gpu/box/0/memory_bytes"] == 2**30
    assert 0 <= samples["machine/box/cpu_percent"] <= 100

    def no_driver() -> int:
        raise Fake.NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    monkeypatch.setattr(Fake, "nvmlDeviceGetCount", staticmethod(no_driver))
    assert list(facts.machine_samples_collect(worker="box")) == ["machine/box/cpu_percent"]


@pytest.mark.django_db(transaction=True)
def test_migration_0007_back_rebuilds_metric_points(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory())
    SeriesPoint.objects.bulk_create(
        [SeriesPoint(experiment=run, key=key, step=step, time=step, value=value)
         for key, step, value in (("train_loss", 10, 2.0), ("images_per_second", 10, 50.0),
                                  ("test_accuracy", 20, 0.9), ("epoch/images_per_second", 20, 45.0),
                                  ("lr", 10, 0.1))]
    )  # fmt: skip
    before = [("experiments", "0006_series_logs_by_rank_tags")]
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(before)
        old = executor.loader.project_state(before).apps.get_model("experiments", "MetricPoint")
        rows = old.objects.filter(experiment_id=run.pk).order_by("seq")
        got = [(r.seq, r.step, r.train_loss, r.images_per_second, r.test_accuracy) for r in rows]
        assert got == [(1, 10, 2.0, 50.0, None), (2, 20, None, 45.0, 0.9)]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert Experiment.objects.filter(pk=run.pk).exists()


def test_the_snapshot_buckets_once_per_stored_state(
    user_factory: Any, experiment_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard.experiments.metrics import series

    run = experiment_factory(owner=user_factory(), last_seq=5)
    SeriesPoint.objects.create(experiment=run, key="lr", step=1, time=0, value=0.1)
    calls: list[int] = []
    real = series.series_buckets
    monkeypatch.setattr(series, "series_buckets", lambda **kw: calls.append(1) or real(**kw))
    first = experiment_snapshot_build(experiment=run, log_lines=10)["series"]
    again = experiment_snapshot_build(experiment=run, log_lines=10)["series"]  # the socket's
    assert first == again and len(calls) == 1
    sink = EventSink(run)  # a new point comes with a new seq: computed afresh
    sink.add({"type": "step", "epoch": 1, "step": 2, "time": 1.0, "lr": 0.2})  # type: ignore[typeddict-item]
    sink.flush()
    run.refresh_from_db()
    later = experiment_snapshot_build(experiment=run, log_lines=10)["series"]
    assert len(calls) == 2 and [b[7] for b in later["lr"]["buckets"]] == [0.1, 0.2]
