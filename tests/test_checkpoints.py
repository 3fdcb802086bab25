"""Checkpoints: stored from `checkpoint` events, listed on the run page, downloaded safely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.experiments.models import Checkpoint, Experiment
from dashboard.experiments.sink import EventSink

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


def url(experiment: Experiment, epoch: int) -> str:
    return reverse("experiment-checkpoint", args=[experiment.pk, epoch])


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
    assert message["url"] == url(experiment, 1) and message["size"] == stored.size
    # A resumed attempt writes epoch 1 again: one row, the newer file.
    sink.add({"type": "checkpoint", "epoch": 1, "step": 64, "path": str(path)})
    sink.add({"type": "checkpoint", "epoch": "2", "path": str(path)})  # malformed: ignored
    sink.flush()
    assert list(Checkpoint.objects.values_list("epoch", "step")) == [(1, 64)]


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
    response = logged_in(owner).get(url(experiment, 2))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"weights of epoch 2"
    assert f'filename="trainyard-{experiment.pk}-epoch-2.pt"' in response["Content-Disposition"]
    # Staff too.
    staff = logged_in(user_factory(staff=True))
    assert staff.get(url(experiment, 2)).status_code == 200


def test_others_and_anonymous_get_nothing(
    runs_dir: Path, user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory())
    path = checkpoint_write(runs_dir, experiment, 1)
    Checkpoint.objects.create(experiment=experiment, epoch=1, path=str(path))
    assert logged_in(user_factory()).get(url(experiment, 1)).status_code == 404
    response = Client().get(url(experiment, 1))
    assert response.status_code == 302 and "login" in response["Location"]
    owner = logged_in(experiment.owner)
    assert owner.get(url(experiment, 9)).status_code == 404  # no checkpoint of that epoch


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
    Checkpoint.objects.create(experiment=experiment, epoch=3, path=str(path))
    response = logged_in(experiment.owner).get(url(experiment, 3))
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
    response = client.get(url(experiment, 1))
    assert response.status_code == 404
    assert "is on gpu-node-7" in response.content.decode()
    html = client.get(experiment.get_absolute_url()).content.decode()
    assert "on gpu-node-7, not on this web server" in html
    assert "2.0 MiB" in html
    assert f'href="{url(experiment, 1)}"' not in html


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
    assert f'href="{url(experiment, 1)}" download' in html
    assert f'href="{url(experiment, 2)}" download' in html
    snapshot = response.context["initial"]
    assert [c["epoch"] for c in snapshot["checkpoints"]] == [1, 2]
    assert all(c["here"] for c in snapshot["checkpoints"])
