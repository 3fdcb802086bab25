"""A user sees only their own runs' facts (issue 35, item 6): the run list's dataset menu and the
waiting reasons name nothing of other users' runs; staff see all."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from dashboard.experiments.runs import sink
from dashboard.experiments.runs.claim import experiment_claim
from dashboard.experiments.scheduling.allocation import Machine
from dashboard.experiments.selectors import experiment_snapshot_build
from tests.factories import logged_in

pytestmark = pytest.mark.django_db

FOUR_CORES = Machine("m1", cpu_count=4, gpu_ids=frozenset())


def test_the_dataset_menu_holds_only_the_users_own_datasets(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice, bob = user_factory(username="alice"), user_factory(username="bob")
    experiment_factory(owner=bob, dataset="bobs-secret-records")
    experiment_factory(owner=alice, dataset="alices-folder")
    page = logged_in(alice).get("/").content.decode()
    assert "alices-folder" in page and "bobs-secret-records" not in page
    staff_page = logged_in(user_factory(staff=True)).get("/").content.decode()
    assert "bobs-secret-records" in staff_page and "alices-folder" in staff_page


def _names(text: str, run: Any) -> bool:
    return re.search(rf"#{run.pk}\b", text) is not None


def test_a_waiting_runs_own_page_names_no_other_users_run(
    user_factory: Any,
    experiment_factory: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Alice's run waits behind Bob's and her own: her run's JSON, page, socket snapshot and
    sent status event name her own run and not Bob's; the queue page names both to staff."""
    monkeypatch.setenv("TRAINYARD_CPU_THREADS_PER_RUN", "2")
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 0
    alice, bob = user_factory(username="alice"), user_factory(username="bob")
    root = user_factory(staff=True)
    on_cores = experiment_factory(
        owner=bob, strategy="ddp", processes=2, status="running", worker="m1"
    )
    own = experiment_factory(
        owner=alice, strategy="single", processes=1, status="running", worker="m1"
    )
    later = experiment_factory(owner=alice, strategy="single", processes=1)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(sink, "events_broadcast", lambda **kwargs: sent.extend(kwargs["messages"]))
    with django_capture_on_commit_callbacks(execute=True):  # the sink sends on commit
        result = experiment_claim(experiment_id=later.pk, machine=FOUR_CORES)
    assert not result.claimed and _names(result.waiting_reason, on_cores)  # stored whole
    client = logged_in(alice)
    said = client.get(f"/api/experiments/{later.pk}/").json()["waiting_reason"]
    assert _names(said, own) and not _names(said, on_cores) and "another user's run" in said
    page = client.get(f"/experiments/{later.pk}/").content.decode()
    assert _names(page, own) and not _names(page, on_cores)
    later.refresh_from_db()
    snapshot = json.dumps(experiment_snapshot_build(experiment=later, log_lines=10))
    assert _names(snapshot, own) and not _names(snapshot, on_cores)
    (status,) = [message for message in sent if message["type"] == "status"]
    assert _names(status["reason"], own) and not _names(status["reason"], on_cores)
    (entry,) = logged_in(root).get("/api/queue/").json()["queue"]
    assert _names(entry["reason"], on_cores)
