"""Django admin: the experiment list, its filters and search, and the stop / clone actions."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from dashboard.experiments.models import Experiment, LogLine, SeriesPoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_(user_factory: Any) -> Client:
    admin = user_factory(username="boss", staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    return client


def test_list_shows_status_strategy_owner_accuracy_and_duration(
    admin_client_: Client, user_factory: Any, experiment_factory: Any
) -> None:
    owner = user_factory(username="carol")
    experiment_factory(owner=owner, name="fast one", status="succeeded", test_accuracy=0.9731)
    page = admin_client_.get("/admin/experiments/experiment/").content.decode()
    for text in ("fast one", "succeeded", "DistributedDataParallel", "DDP", "carol", "97.31%"):
        assert text in page
    filtered = admin_client_.get("/admin/experiments/experiment/?status__exact=failed")
    assert "fast one" not in filtered.content.decode()
    assert "fast one" in admin_client_.get("/admin/experiments/experiment/?q=fast").content.decode()


def test_change_page_shows_points_and_logs_read_only(
    admin_client_: Client, user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory())
    SeriesPoint.objects.create(experiment=run, key="train_loss", step=10, time=1, value=0.4321)
    LogLine.objects.create(experiment=run, seq=2, message="hello from rank 0")
    page = admin_client_.get(f"/admin/experiments/experiment/{run.pk}/change/").content.decode()
    assert "0.4321" in page and "hello from rank 0" in page
    assert "train_loss: 1 points" in page  # a line a series, not an inline of every point
    assert 'name="series-0-value"' not in page  # shown, not editable


def test_stop_and_clone_actions(
    admin_client_: Client, user_factory: Any, experiment_factory: Any, monkeypatch: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    from dashboard.experiments import tasks

    queued: list[int] = []
    monkeypatch.setattr(tasks.run_experiment, "delay", queued.append)
    run = experiment_factory(owner=user_factory(), name="again", epochs=3)
    url = "/admin/experiments/experiment/"
    admin_client_.post(url, {"action": "stop_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == "cancelled" and run.cancelled_by.username == "boss"
    with django_capture_on_commit_callbacks(execute=True):
        admin_client_.post(url, {"action": "clone_and_relaunch", "_selected_action": [run.pk]})
    clone = Experiment.objects.exclude(pk=run.pk).get()
    assert clone.cloned_from == run and clone.epochs == 3 and clone.status == "queued"
    assert queued == [clone.pk]


def test_launches_go_through_the_form_and_records_stay_as_run(
    admin_client_: Client, user_factory: Any, experiment_factory: Any
) -> None:
    # Adding here would skip the launch's validation and never reach a worker.
    assert admin_client_.get("/admin/experiments/experiment/add/").status_code == 403
    run = experiment_factory(owner=user_factory(), status="succeeded", lr=0.001)
    page = admin_client_.get(f"/admin/experiments/experiment/{run.pk}/change/").content.decode()
    assert 'name="name"' in page  # a rename is harmless
    assert 'name="lr"' not in page and 'name="strategy"' not in page and "0.001" in page


def test_the_change_page_reads_its_json_formatted_read_only_and_folded(
    admin_client_: Client, user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(
        owner=user_factory(),
        run_info={"world_size": 2, "devices": ["cpu", "cpu"]},
        tags=["baseline"],
        note="first try",
    )
    page = admin_client_.get(f"/admin/experiments/experiment/{run.pk}/change/").content.decode()
    # The run's reports in a <pre> each, indented, not a box of one-line JSON to edit.
    # Formatted, a key a line (in PostgreSQL's jsonb order, not the one it was written in).
    assert '<pre class="json">{\n  &quot;' in page and "\n  &quot;world_size&quot;: 2" in page
    for name in ("run_info", "rank_stats", "memory", "attempts", "stalled", "tags", "gpus"):
        assert f'name="{name}"' not in page, name
    assert "baseline" in page and 'name="note"' in page and 'name="name"' in page
    # What it was launched with, what it reported and its bookkeeping: folded sections.
    for title in ("Launched with", "What it reported", "Requests and bookkeeping"):
        assert title in page
    assert page.count('class="module collapse') >= 3 or page.count("<details") >= 3


def test_the_list_filters_mean_something_and_the_admin_is_branded(
    admin_client_: Client, user_factory: Any, experiment_factory: Any
) -> None:
    experiment_factory(owner=user_factory(), name="one", status="succeeded")
    page = admin_client_.get("/admin/experiments/experiment/").content.decode()
    # No filter per strategy option ("By accumulate: 1, -"), the ones a person looks by.
    assert "By accumulate" not in page and "By comm hook" not in page
    assert "By status" in page and "By strategy" in page and "By dataset" in page
    index = admin_client_.get("/admin/").content.decode()
    for text in (page, index):
        assert "Trainyard administration" in text
        assert '<link rel="icon" href="data:image/svg+xml,' in text  # no /favicon.ico asked
