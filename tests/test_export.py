"""GET /api/experiments/<id>/export/: every stored point read back from the CSV (csv module),
the JSON, and the TensorBoard zip (TensorBoard's own EventAccumulator); who may export."""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.test import AsyncClient, Client
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from dashboard.accounts.models import ApiToken
from dashboard.experiments.metrics.exports import RUN_TEXT_TAG
from dashboard.experiments.models import Experiment, SeriesPoint
from tests.factories import float32, logged_in

pytestmark = pytest.mark.django_db

STARTED = datetime(2026, 12, 1, 10, 30, 0, 250000, tzinfo=UTC)
Stored = dict[str, list[tuple[int, float, float | None]]]


def stored_series(experiment: Experiment) -> Stored:
    found: Stored = {}
    for point in SeriesPoint.objects.filter(experiment=experiment).order_by("key", "step", "id"):
        found.setdefault(point.key, []).append((point.step, point.time, point.value))
    return found


@pytest.fixture
def alice(user_factory: Any) -> Any:
    return user_factory(username="alice")


@pytest.fixture
def run(alice: Any, experiment_factory: Any) -> Experiment:
    """A finished run with a long series, a sparse one, a per-rank one and a value that was not
    finite (stored as null); values like 0.1 that no binary float holds exactly."""
    experiment = experiment_factory(
        owner=alice, name="ddp / 2 ranks", status="succeeded", started_at=STARTED
    )
    points = [
        SeriesPoint(
            experiment=experiment, key="train_loss", step=s, time=s * 0.37, value=1 / (s + 1)
        )
        for s in range(2500)
    ]
    points += [
        SeriesPoint(experiment=experiment, key="test_accuracy", step=s, time=s * 0.4, value=v)
        for s, v in [(800, 0.1), (1600, 0.9123456789), (2499, 0.97)]
    ]
    points += [
        SeriesPoint(experiment=experiment, key="rank/1/images_per_second", step=s, time=s, value=v)
        for s, v in [(0, None), (1, 1234.5), (2, 1e-7)]
    ]
    SeriesPoint.objects.bulk_create(points)
    return experiment


def export(client: Client, experiment: Experiment, kind: str, **headers: str) -> Any:
    return client.get(f"/api/experiments/{experiment.pk}/export/?format={kind}", **headers)


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def test_csv_holds_every_point_as_stored(alice: Any, run: Experiment) -> None:
    response = export(logged_in(alice), run, "csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert response.streaming, "sent as it is read, not built in memory"
    assert 'filename="trainyard-' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(body(response).decode())))
    assert list(rows[0]) == ["key", "step", "time", "value"]
    read: Stored = {}
    for row in rows:
        value = float(row["value"]) if row["value"] else None
        read.setdefault(row["key"], []).append((int(row["step"]), float(row["time"]), value))
    assert read == stored_series(run)
    assert len(rows) == 2506


def test_json_holds_every_point_as_stored(alice: Any, run: Experiment) -> None:
    response = export(logged_in(alice), run, "json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    data = json.loads(body(response))
    assert data["id"] == run.pk and data["name"] == "ddp / 2 ranks"
    assert datetime.fromisoformat(data["started_at"]) == STARTED
    read = {key: [tuple(p) for p in points] for key, points in data["series"].items()}
    assert read == stored_series(run)


def test_json_of_a_run_without_points_is_valid(alice: Any, experiment_factory: Any) -> None:
    empty = experiment_factory(owner=alice)
    assert json.loads(body(export(logged_in(alice), empty, "json")))["series"] == {}


def tensorboard_read(folder: Path) -> dict[str, list[Any]]:
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}


def test_tensorboard_zip_reads_back_in_tensorboard(
    alice: Any, run: Experiment, tmp_path: Path
) -> None:
    response = export(logged_in(alice), run, "tensorboard")
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(body(response))) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path)
    # One log folder named after the run, with its event file: `tensorboard --logdir .` there.
    assert len(names) == 1 and names[0].startswith(f"trainyard-{run.pk}-ddp-2-ranks/")
    assert "tfevents" in names[0]
    scalars = tensorboard_read(tmp_path / names[0].split("/")[0])
    # Written by step across tags, as a training writes: no step goes back in the file.
    # (The run's launch fields are one text summary first, exports.RUN_TAG: not a series.)
    steps = [
        e.step
        for e in EventFileLoader(str(tmp_path / names[0])).Load()
        if e.summary.value and e.summary.value[0].tag != RUN_TEXT_TAG
    ]
    assert len(steps) == 2506 and steps == sorted(steps)
    stored = stored_series(run)
    assert sorted(scalars) == sorted(stored)
    for key, points in stored.items():
        events = scalars[key]
        assert [e.step for e in events] == [step for step, _, _ in points]
        for event, (_, time, value) in zip(events, points, strict=True):
            assert event.wall_time == pytest.approx(STARTED.timestamp() + time, abs=1e-6)
            if value is None:
                assert math.isnan(event.value), "a value that was not finite is NaN there"
            else:
                assert event.value == float32(value)


def test_unknown_format_is_refused(alice: Any, run: Experiment) -> None:
    response = export(logged_in(alice), run, "xlsx")
    assert response.status_code == 400 and "csv, json, tensorboard" in response.json()["error"]


@pytest.mark.parametrize("kind", ["csv", "json", "tensorboard"])
def test_another_users_run_is_never_exported(user_factory: Any, run: Experiment, kind: str) -> None:
    response = export(logged_in(user_factory(username="bob")), run, kind)
    assert response.status_code == 404 and response.json() == {"error": f"no experiment {run.pk}"}
    assert export(Client(), run, kind).status_code == 401


def test_staff_and_the_owners_token_export(alice: Any, user_factory: Any, run: Experiment) -> None:
    assert export(logged_in(user_factory(staff=True)), run, "csv").status_code == 200
    token = ApiToken.objects.create(user=alice)
    response = export(Client(), run, "json", HTTP_AUTHORIZATION=f"Bearer {token.key}")
    assert response.status_code == 200 and json.loads(body(response))["id"] == run.pk
    bob_token = ApiToken.objects.create(user=user_factory(username="bob"))
    response = export(Client(), run, "json", HTTP_AUTHORIZATION=f"Bearer {bob_token.key}")
    assert response.status_code == 404


def test_the_run_and_compare_pages_link_every_format(alice: Any, run: Experiment) -> None:
    client = logged_in(alice)
    page = client.get(f"/experiments/{run.pk}/").content.decode()
    compare = client.get(f"/experiments/compare/?ids={run.pk}").content.decode()
    for kind in ("csv", "json", "tensorboard"):
        link = f'href="/api/experiments/{run.pk}/export/?format={kind}" download'
        assert link in page and link in compare


def test_compared_runs_as_one_tensorboard_log(
    alice: Any, user_factory: Any, experiment_factory: Any, run: Experiment, tmp_path: Path
) -> None:
    other = experiment_factory(owner=alice, name="single", started_at=STARTED)
    SeriesPoint.objects.create(experiment=other, key="train_loss", step=3, time=1.5, value=0.25)
    bobs = experiment_factory(owner=user_factory(username="bob"), name="bob's")
    SeriesPoint.objects.create(experiment=bobs, key="train_loss", step=1, time=1, value=9)
    client = logged_in(alice)
    url = f"/api/experiments/compare/export/?ids={run.pk},{other.pk},{bobs.pk}"
    response = client.get(url)
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(body(response))) as archive:
        archive.extractall(tmp_path)
    # A folder per run of the caller's (bob's is left out): TensorBoard overlays them.
    folders = [f"trainyard-{run.pk}-ddp-2-ranks", f"trainyard-{other.pk}-single"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(folders)  # "10" sorts before "9"
    single = tensorboard_read(tmp_path / folders[1])
    assert [(e.step, e.value) for e in single["train_loss"]] == [(3, 0.25)]
    assert len(tensorboard_read(tmp_path / folders[0])["train_loss"]) == 2500
    page = client.get(f"/experiments/compare/?ids={run.pk},{other.pk}").content.decode()
    assert f'href="/api/experiments/compare/export/?ids={run.pk},{other.pk}" download' in page
    assert client.get(f"/api/experiments/compare/export/?ids={bobs.pk}").status_code == 404
    assert client.get("/api/experiments/compare/export/?ids=x").status_code == 400


@pytest.mark.django_db(transaction=True)
async def test_under_asgi_the_csv_is_sent_a_chunk_at_a_time(alice: Any, run: Experiment) -> None:
    """Daphne serves through Django's ASGI handler, which reads a synchronous iterator whole
    into memory (and warns); the export hands it an asynchronous one instead."""
    client = AsyncClient()
    await client.aforce_login(alice)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        response = await client.get(f"/api/experiments/{run.pk}/export/?format=csv")
        assert response.status_code == 200 and response.is_async
        chunks = [chunk async for chunk in response.streaming_content]
    assert len(chunks) > 1
    rows = list(csv.reader(io.StringIO(b"".join(chunks).decode())))
    assert len(rows) == 1 + 2506 and rows[1] == ["rank/1/images_per_second", "0", "0.0", ""]


@pytest.mark.django_db
def test_an_export_over_its_limit_is_refused_with_what_to_use(
    alice: Any, run: Experiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TensorBoard zip is written whole in the request: it is refused past its own (lower)
    limit, pointing to the streamed CSV; CSV and JSON past theirs."""
    client = logged_in(alice)
    points = SeriesPoint.objects.filter(experiment=run).count()
    url = f"/api/experiments/{run.pk}/export/?format="
    monkeypatch.setenv("TRAINYARD_EXPORT_TENSORBOARD_MAX_POINTS", str(points - 1))
    for refused in (url + "tensorboard", f"/api/experiments/compare/export/?ids={run.pk}"):
        response = client.get(refused)
        assert response.status_code == 413, refused
        error = response.json()["error"]
        assert f"over {points - 1} points" in error and "?format=csv" in error
    assert client.get(url + "csv").status_code == 200
    monkeypatch.setenv("TRAINYARD_EXPORT_TENSORBOARD_MAX_POINTS", str(points))
    assert client.get(url + "tensorboard").status_code == 200  # at the limit: taken
    monkeypatch.setenv("TRAINYARD_EXPORT_MAX_POINTS", str(points - 1))
    for kind in ("csv", "json"):
        response = client.get(url + kind)
        assert (
            response.status_code == 413
            and "TRAINYARD_EXPORT_MAX_POINTS" in response.json()["error"]
        )
