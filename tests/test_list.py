"""The run list API: keyset pages, search, filters, tags, sorts, conditional GETs, who sees what,
and the tags and note an owner edits."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.utils import timezone

from dashboard.experiments.core.descriptions import experiment_duration_seconds
from dashboard.experiments.models import Experiment, Status

pytestmark = pytest.mark.django_db


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def all_pages(client: Client, url: str, *, between: Any = None) -> list[dict[str, Any]]:
    """Every row of every page, following `next`; `between` runs after each page."""
    rows: list[dict[str, Any]] = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        rows += body["experiments"]
        url = body["next"]
        if between is not None:
            between()
    return rows


def test_pages_have_no_duplicates_or_gaps_while_new_runs_arrive(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    made = [experiment_factory(owner=alice, name=f"run {i}").pk for i in range(23)]
    arrived: list[int] = []

    def launch_one() -> None:
        arrived.append(experiment_factory(owner=alice, name="late").pk)

    rows = all_pages(logged_in(alice), "/api/experiments/?limit=5", between=launch_one)
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids))
    assert ids == sorted(made, reverse=True)  # newest first; the late ones sort before page 1
    assert arrived and not set(arrived) & set(ids)


def test_count_and_next_and_the_old_key(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    for i in range(3):
        experiment_factory(owner=alice, name=f"run {i}")
    body = logged_in(alice).get("/api/experiments/?limit=2").json()
    assert body["count"] == 3 and len(body["experiments"]) == 2
    assert body["next"].startswith("http://testserver/api/experiments/?")
    assert "page=" in body["next"]
    last = logged_in(alice).get(body["next"]).json()
    assert last["count"] == 3 and len(last["experiments"]) == 1 and last["next"] is None
    # Without a limit, a page holds what the list answered before it had pages.
    assert len(logged_in(alice).get("/api/experiments/").json()["experiments"]) == 3


@pytest.mark.parametrize(
    ("sort", "key"),
    [
        ("name", lambda e: (e.name, e.pk)),
        ("-name", lambda e: (e.name, e.pk)),
        ("accuracy", lambda e: (e.test_accuracy is None, e.test_accuracy or 0, e.pk)),
        ("status", lambda e: (e.status, e.pk)),
        (
            "duration",
            lambda e: (
                e.finished_at is None,
                e.finished_at and experiment_duration_seconds(experiment=e),
                e.pk,
            ),
        ),
        ("created", lambda e: (e.created_at, e.pk)),
    ],
)
def test_every_sort_pages_through_every_row_once(
    user_factory: Any, experiment_factory: Any, sort: str, key: Any
) -> None:
    alice = user_factory()
    now = timezone.now()
    runs = []
    for i in range(11):
        finished = i % 3 != 0
        runs.append(
            experiment_factory(
                owner=alice,
                name=f"run {i % 4}",  # ties, broken by id
                status=Status.SUCCEEDED if finished else Status.RUNNING,
                test_accuracy=None if i % 4 == 0 else (i % 5) / 10,
                started_at=now - timedelta(seconds=100),
                finished_at=now - timedelta(seconds=100 - (i % 5) * 7) if finished else None,
            )
        )
    rows = all_pages(logged_in(alice), f"/api/experiments/?limit=3&sort={sort}")
    expected = sorted(runs, key=key)
    if sort == "-name":  # descending, ties by id descending too
        expected = sorted(runs, key=key, reverse=True)
    assert [r["id"] for r in rows] == [e.pk for e in expected]


def test_search_filters_and_tags(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    wanted = experiment_factory(
        owner=alice, name="Baseline DDP", strategy="ddp", tags=["baseline", "fast"]
    )
    experiment_factory(owner=alice, name="baseline single", strategy="single", tags=["fast"])
    experiment_factory(
        owner=alice, name="other", strategy="ddp", dataset="fashion-mnist", status=Status.FAILED
    )
    client = logged_in(alice)

    def ids(query: str) -> list[int]:
        return [e["id"] for e in client.get(f"/api/experiments/?{query}").json()["experiments"]]

    assert len(ids("q=BASELINE")) == 2
    assert ids("q=baseline&strategy=ddp") == [wanted.pk]
    assert ids("tag=baseline") == [wanted.pk]
    assert len(ids("tag=fast")) == 2 and ids("tag=fas") == []
    # Exact, as on PostgreSQL: SQLite's LIKE on the list's text ignored case.
    assert ids("tag=Baseline") == [] and ids("tag=FAST") == []
    assert ids(urlencode({"tag": 'baseline", "fast'})) == [] and ids("tag=%25") == []
    accented = experiment_factory(owner=alice, name="accented", tags=["Café"])
    assert ids(urlencode({"tag": "Café"})) == [accented.pk]
    assert ids(urlencode({"tag": "café"})) == []
    assert len(ids("status=failed")) == 1 and len(ids("dataset=fashion-mnist")) == 1
    assert ids("status=queued&tag=baseline") == [wanted.pk]
    response = client.get("/api/experiments/?status=sleeping")
    assert response.status_code == 400 and "status must be one of" in response.json()["error"]
    assert client.get("/api/experiments/?sort=colour").status_code == 400
    assert client.get("/api/experiments/?page=garbage").status_code == 400


def test_a_cursor_of_one_sort_is_refused_by_another(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    for _ in range(3):
        experiment_factory(owner=alice)
    client = logged_in(alice)
    following = client.get("/api/experiments/?limit=1&sort=name").json()["next"]
    page = following.split("page=")[1].split("&")[0]
    response = client.get(f"/api/experiments/?limit=1&page={page}")
    assert response.status_code == 400 and "another sort" in response.json()["error"]


def test_an_unchanged_list_answers_304_with_no_body(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status=Status.RUNNING, started_at=timezone.now())
    client = logged_in(alice)
    first = client.get("/api/experiments/")
    etag = first["ETag"]
    again = client.get("/api/experiments/", HTTP_IF_NONE_MATCH=etag)
    # The running run's duration moved on; the page ticks that itself.
    assert again.status_code == 304 and again.content == b"" and again["ETag"] == etag
    Experiment.objects.filter(pk=run.pk).update(step=5)
    changed = client.get("/api/experiments/", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed.json()["experiments"][0]["step"] == 5
    assert changed["ETag"] != etag


def test_another_users_runs_never_appear(user_factory: Any, experiment_factory: Any) -> None:
    alice, bob, staff = user_factory(), user_factory(), user_factory(staff=True)
    mine = experiment_factory(owner=alice, name="shared words", tags=["t"])
    theirs = experiment_factory(owner=bob, name="shared words", tags=["t"])
    for query in ("", "q=shared", "tag=t", f"owner={bob.username}", "sort=name", "limit=1"):
        rows = all_pages(logged_in(alice), f"/api/experiments/?{query}")
        assert theirs.pk not in {r["id"] for r in rows}, query
    body = logged_in(alice).get(f"/api/experiments/?owner={bob.username}").json()
    assert body == {"count": 0, "next": None, "experiments": []}
    staff_rows = all_pages(logged_in(staff), f"/api/experiments/?owner={bob.username}")
    assert [r["id"] for r in staff_rows] == [theirs.pk]
    assert {r["id"] for r in all_pages(logged_in(staff), "/api/experiments/")} == {
        mine.pk,
        theirs.pk,
    }


def patch(client: Client, pk: int, body: Any) -> Any:
    return client.patch(
        f"/api/experiments/{pk}/", json.dumps(body), content_type="application/json"
    )


def test_the_owner_edits_tags_and_note(user_factory: Any, experiment_factory: Any) -> None:
    alice, bob, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = experiment_factory(owner=alice, name="keep")
    labels = {"tags": [" baseline ", "baseline", "x"], "note": "n"}
    response = patch(logged_in(alice), run.pk, labels)
    assert response.status_code == 200, response.content
    assert response.json()["tags"] == ["baseline", "x"] and response.json()["note"] == "n"
    run.refresh_from_db()
    assert run.tags == ["baseline", "x"] and run.note == "n" and run.name == "keep"
    assert patch(logged_in(staff), run.pk, {"note": "by staff"}).status_code == 200
    assert patch(logged_in(bob), run.pk, {"note": "mine now"}).status_code == 404
    for bad in ({"name": "other"}, {"tags": "baseline"}, {"tags": ["x" * 41]}, {"note": 3}):
        refused = patch(logged_in(alice), run.pk, bad)
        assert refused.status_code == 400, bad
    run.refresh_from_db()
    assert run.note == "by staff" and run.name == "keep" and run.tags == ["baseline", "x"]


def test_a_session_patch_needs_the_csrf_token(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert patch(client, run.pk, {"note": "x"}).status_code == 403
