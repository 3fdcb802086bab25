"""Checkpoints: stored from `checkpoint` events, listed on the run page, downloaded safely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.accounts.models import ApiToken
from dashboard.experiments.models import Checkpoint, Experiment
from dashboard.experiments.runs.sink import EventSink

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs_dir(settings: Any, tmp_path: Path) -> Path:
    settings.TRAINYARD_RUNS_DIR = tmp_path / "runs"
    settings.TRAINYARD_RUNS_DIR.mkdir()
    return settings.TRAINYARD_RUNS_DIR


def checkpoint_write(runs_dir: Path, experiment: Experiment, epoch: int) -> Path:
    folder = runs_dir / str(experiment.pk) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch-{epoch}.pt"
    path.write_bytes(b"weights of epoch %d" % epoch)
    return path


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def url(experiment: Experiment, step: int) -> str:
    return reverse("experiment-checkpoint", args=[experiment.pk, step])


def test_sink_stores_checkpoints_with_their_size(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory(), worker="box-1", status="running")
    path = checkpoint_write(runs_dir, experiment, 1)
    sink = EventSink(experiment)
    message = sink.add({"type": "checkpoint", "epoch": 1, "step": 63, "path": str(path)})
    sink.flush()
    stored = Checkpoint.objects.get(experiment=experiment)
    assert (stored.epoch, stored.step, stored.path) == (1, 63, str(path))
    assert stored.size == path.stat().st_size and stored.worker == "box-1"
    assert message["url"] == url(experiment, 63) and message["size"] == stored.size
    assert not stored.requested
    # A resumed attempt writes step 63 again: one row, the newer file.
    again = checkpoint_write(runs_dir, experiment, 11)
    sink.add({"type": "checkpoint", "epoch": 1, "step": 63, "path": str(again)})
    sink.add({"type": "checkpoint", "epoch": "2", "step": 9, "path": str(path)})  # malformed
    sink.add({"type": "checkpoint", "epoch": 2, "path": str(path)})  # no step: ignored
    sink.flush()
    assert list(Checkpoint.objects.values_list("epoch", "step", "path")) == [(1, 63, str(again))]


def test_sink_stores_a_requested_checkpoint_beside_the_epochs(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory(), worker="box-1", status="running")
    epoch_1 = checkpoint_write(runs_dir, experiment, 1)
    asked = epoch_1.with_name("step-80.pt")
    asked.write_bytes(b"asked for")
    sink = EventSink(experiment)
    sink.add({"type": "checkpoint", "epoch": 1, "step": 63, "path": str(epoch_1)})
    message = sink.add(
        {"type": "checkpoint", "epoch": 2, "step": 80, "path": str(asked), "requested": True}
    )
    sink.flush()
    assert message["url"] == url(experiment, 80)
    rows = Checkpoint.objects.values_list("epoch", "step", "requested")
    assert list(rows) == [(1, 63, False), (2, 80, True)]
    assert experiment.logs.filter(
        message="checkpoint saved on request at step 80 (epoch 2)"
    ).exists()
    html = logged_in(experiment.owner).get(experiment.get_absolute_url()).content.decode()
    assert "on request, mid-epoch" in html and f'href="{url(experiment, 80)}" download' in html


def test_checkpoints_deleted_by_retention_leave_the_list(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory(), worker="box-1", status="running")
    paths = {epoch: checkpoint_write(runs_dir, experiment, epoch) for epoch in (1, 2, 3)}
    sink = EventSink(experiment)
    for epoch in (1, 2):
        sink.add({"type": "checkpoint", "epoch": epoch, "step": epoch, "path": str(paths[epoch])})
    sink.flush()
    paths[1].unlink()  # the training keeps the last two
    message = sink.add({"type": "checkpoint", "epoch": 3, "step": 3, "path": str(paths[3])})
    assert message["pruned"] == [1]
    sink.flush()
    assert list(Checkpoint.objects.values_list("epoch", flat=True)) == [2, 3]


def test_owner_downloads_a_checkpoint(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    owner = user_factory()
    experiment = experiment_factory(owner=owner)
    path = checkpoint_write(runs_dir, experiment, 2)
    Checkpoint.objects.create(experiment=experiment, epoch=2, step=10, path=str(path), size=18)
    response = logged_in(owner).get(url(experiment, 10))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"weights of epoch 2"
    assert f'filename="trainyard-{experiment.pk}-epoch-2.pt"' in response["Content-Disposition"]
    assert response["Content-Type"] == "application/octet-stream"
    # Staff too.
    staff = logged_in(user_factory(staff=True))
    assert staff.get(url(experiment, 10)).status_code == 200


def test_others_and_anonymous_get_nothing(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory())
    path = checkpoint_write(runs_dir, experiment, 1)
    Checkpoint.objects.create(experiment=experiment, epoch=1, step=5, path=str(path))
    assert logged_in(user_factory()).get(url(experiment, 5)).status_code == 404
    response = Client().get(url(experiment, 5))
    assert response.status_code == 302 and "login" in response["Location"]
    owner = logged_in(experiment.owner)
    assert owner.get(url(experiment, 5)).status_code == 200
    assert owner.get(url(experiment, 9)).status_code == 404  # no checkpoint at that step


@pytest.mark.parametrize("where", ["traversal", "outside", "other-run", "symlink-out"])
def test_paths_outside_the_runs_folder_are_404(
    runs_dir: Path, tmp_path: Path, user_factory: Any, experiment_factory: Any, where: str
) -> None:
    experiment = experiment_factory(owner=user_factory())
    secret = tmp_path / "secret.txt"
    secret.write_text("not a checkpoint")
    other = experiment_factory(owner=experiment.owner)
    folder = checkpoint_write(runs_dir, experiment, 1).parent
    path = {
        "traversal": folder / ".." / ".." / ".." / "secret.txt",
        "outside": secret,
        # Another run's file, even one's own: each run serves its own folder only.
        "other-run": checkpoint_write(runs_dir, other, 1),
        "symlink-out": folder / "epoch-3.pt",
    }[where]
    if where == "symlink-out":
        path.symlink_to(secret)
    Checkpoint.objects.create(experiment=experiment, epoch=3, step=30, path=str(path))
    response = logged_in(experiment.owner).get(url(experiment, 30))
    assert response.status_code == 404
    assert b"not a checkpoint" not in response.content


def test_a_file_on_another_machine_says_where_it_is(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory(), worker="gpu-node-7", status="succeeded")
    Checkpoint.objects.create(
        experiment=experiment,
        epoch=1,
        step=63,
        path=f"/srv/trainyard/runs/{experiment.pk}/checkpoints/epoch-1.pt",
        size=2 * 1024**2,
        worker="gpu-node-7",
    )
    client = logged_in(experiment.owner)
    response = client.get(url(experiment, 63))
    assert response.status_code == 404
    assert "is on gpu-node-7" in response.content.decode()
    html = client.get(experiment.get_absolute_url()).content.decode()
    assert "on gpu-node-7, not on this web server" in html
    assert "2.0 MiB" in html
    assert f'href="{url(experiment, 63)}"' not in html


def test_scripts_list_and_download_checkpoints_with_a_token(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    owner = user_factory()
    experiment = experiment_factory(owner=owner, worker="gpu-node-7", status="succeeded")
    here = checkpoint_write(runs_dir, experiment, 1)
    Checkpoint.objects.create(experiment=experiment, epoch=1, step=63, path=str(here), size=18)
    elsewhere = f"/srv/trainyard/runs/{experiment.pk}/checkpoints/epoch-2.pt"
    Checkpoint.objects.create(experiment=experiment, epoch=2, step=126, path=elsewhere)
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.objects.create(user=owner).key}"}
    client = Client()

    listed = client.get(f"/api/experiments/{experiment.pk}/checkpoints/", **bearer).json()
    assert [(c["epoch"], c["step"]) for c in listed["checkpoints"]] == [(1, 63), (2, 126)]
    first, second = (c["api_url"] for c in listed["checkpoints"])
    response = client.get(first, **bearer)
    assert response.status_code == 200 and b"".join(response.streaming_content) == here.read_bytes()
    assert response["Content-Type"] == "application/octet-stream"
    missing = client.get(second, **bearer)
    assert missing.status_code == 404 and "is on gpu-node-7" in missing.json()["error"]
    no_step = client.get(f"/api/experiments/{experiment.pk}/checkpoints/5/", **bearer)
    assert no_step.status_code == 404 and "no checkpoint at step 5" in no_step.json()["error"]
    # Nobody else's token, and no token at all, gets anything.
    stranger = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.objects.create(user=user_factory()).key}"}
    assert client.get(first, **stranger).status_code == 404
    assert client.get(first).status_code == 401


def test_run_page_lists_downloadable_checkpoints(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory(), status="succeeded")
    for epoch in (1, 2):
        path = checkpoint_write(runs_dir, experiment, epoch)
        Checkpoint.objects.create(
            experiment=experiment, epoch=epoch, step=63 * epoch, path=str(path), size=18
        )
    response = logged_in(experiment.owner).get(experiment.get_absolute_url())
    html = response.content.decode()
    assert f'href="{url(experiment, 63)}" download' in html
    assert f'href="{url(experiment, 126)}" download' in html
    snapshot = response.context["initial"]
    assert [c["epoch"] for c in snapshot["checkpoints"]] == [1, 2]
    assert all(c["here"] for c in snapshot["checkpoints"])


@pytest.mark.django_db(transaction=True)
def test_migration_0004_rolls_back_keeping_each_epochs_newest(
    user_factory: Any, experiment_factory: Any
) -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    experiment = experiment_factory(owner=user_factory())
    for epoch, step, requested in ((1, 5, True), (1, 10, False), (2, 20, False)):
        Checkpoint.objects.create(
            experiment=experiment, epoch=epoch, step=step, requested=requested, path="x"
        )
    before = [("experiments", "0003_strategies_checkpoints_rank_stats")]
    after = [("experiments", "0004_checkpoints_on_request")]
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(before)
        old = executor.loader.project_state(before).apps.get_model("experiments", "Checkpoint")
        rows = old.objects.order_by("epoch").values_list("epoch", "step")
        assert list(rows) == [(1, 10), (2, 20)]  # epoch 1's requested one gave way
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        # And on to the newest, which later tests expect.
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
