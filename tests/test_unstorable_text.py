"""Text no database column holds (a NUL character, which PostgreSQL refuses in any text value,
and a lone UTF-16 surrogate, which no UTF-8 codec encodes) is a 400 naming the field on every
way in: JSON bodies, query parameters, multipart fields and imported series names. Schemathesis
found the first on PostgreSQL (PATCH /api/experiments/{pk}/ with a tag holding \\u0000: a 500);
this file runs in the PostgreSQL pass too, where each case was that 500."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from dashboard.experiments.models import Experiment
from dashboard.text_input import text_fault, texts_fault
from tests.factories import api_post, logged_in

pytestmark = pytest.mark.django_db

NUL = "a\x00b"
# json.dumps writes a lone surrogate as the escape "\udc80", which json.loads reads back as one.
LONE = "a\udc80b"


def patch_raw(client: Client, pk: int, body: str) -> Any:
    return client.patch(f"/api/experiments/{pk}/", body, content_type="application/json")


def test_text_fault_names_what_cannot_be_stored() -> None:
    assert text_fault("ôé 🤖 plain") == ""
    assert "NUL" in text_fault(NUL)
    assert "surrogate" in text_fault(LONE)
    assert texts_fault({"tags": ["ok", NUL]}) == {"tags": [text_fault(NUL)]}
    assert texts_fault({"x": {"deep": [LONE]}}) == {"x": [text_fault(LONE)]}
    assert texts_fault({NUL: 1}) == {NUL: [text_fault(NUL)]}  # a key is text too


def test_labels_with_unstorable_text_are_refused_and_nothing_changes(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, name="keep")
    client = logged_in(alice)
    for field, value in (("tags", ["ok", NUL]), ("note", NUL), ("tags", [LONE]), ("note", LONE)):
        response = patch_raw(client, run.pk, json.dumps({field: value}))
        assert response.status_code == 400, (field, value, response.content)
        assert list(response.json()["errors"]) == [field]
        assert "cannot be stored" in response.json()["error"]
    # The same characters the fuzzer sent around the NUL are stored (paired surrogates: 🤖).
    fine = {"tags": ["ô", "È🤖"], "note": "!ïtÀ"}
    response = patch_raw(client, run.pk, json.dumps(fine))
    assert response.status_code == 200, response.content
    run.refresh_from_db()
    assert run.tags == fine["tags"] and run.note == fine["note"]


def test_launch_study_and_token_bodies_refuse_unstorable_text(
    user_factory: Any, launched: list[int]
) -> None:
    client = logged_in(user_factory())
    response = api_post(client, {"name": NUL})
    assert response.status_code == 400 and "name" in response.json()["errors"]
    study = client.post(
        "/api/studies/", json.dumps({"name": LONE}), content_type="application/json"
    )
    assert study.status_code == 400 and "name" in study.json()["errors"]
    # The token route reads credentials from the body: an unreadable one is a 401 with the reason
    # (a NUL in the username reached the user lookup before: a 500 on PostgreSQL).
    body = json.dumps({"username": NUL, "password": "pw"})
    token = client.post("/api/tokens/", body, content_type="application/json")
    assert token.status_code == 401 and "cannot be stored" in token.json()["error"]
    assert launched == [] and not Experiment.objects.exists()


def test_query_parameters_with_a_nul_are_a_400_before_any_filter(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    experiment_factory(owner=alice, tags=["x"])
    client = logged_in(alice)
    for key in ("q", "tag", "name", "owner", "model"):
        answer = client.get("/api/experiments/", {key: NUL})
        assert answer.status_code == 400, (key, answer.content)
        assert answer.json()["errors"] == {key: [text_fault(NUL)]}
    page = client.get("/experiments/", {"tag": NUL})
    assert page.status_code == 400 and b"NUL" in page.content
    assert client.get("/api/experiments/", {"tag": "x"}).json()["count"] == 1


def test_an_import_refuses_unstorable_fields_and_series_names(user_factory: Any) -> None:
    client = logged_in(user_factory())

    def send(content: bytes, **fields: str) -> Any:
        upload = SimpleUploadedFile("run.csv", content)
        return client.post("/api/experiments/import/", {"file": upload, **fields})

    named = send(b"step,loss\n1,2\n", name=NUL)
    assert named.status_code == 400 and "name" in named.json()["errors"]
    series = send(b"step,lo\x00ss\n1,2\n")
    assert series.status_code == 400 and "NUL" in series.json()["error"]
    assert not Experiment.objects.exists()
    assert send(b"step,loss\n1,2\n", name="fine").status_code == 201


def test_a_forged_page_cursor_is_a_400_not_a_database_error(
    user_factory: Any, experiment_factory: Any
) -> None:
    """The run list's cursor is base64 JSON: the query-parameter guard sees only its letters,
    so its value is checked when read (a NUL, or a string against a number column, was a 500
    on PostgreSQL)."""
    alice = user_factory()
    for _ in range(3):
        experiment_factory(owner=alice)
    client = logged_in(alice)
    following = client.get("/api/experiments/?limit=1&sort=name").json()["next"]
    assert client.get(following).status_code == 200  # a cursor the list gave still reads

    def forged(sort: str, value: Any, pk: Any = 1) -> str:
        raw = json.dumps({"s": sort, "v": value, "i": pk}).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    for sort, value, pk in (
        ("name", NUL, 1), ("name", 5, 1), ("accuracy", "x", 1), ("accuracy", True, 1),
        ("duration", [1], 1), ("created", LONE, 1), ("name", "a", 2**70), ("name", "a", 0),
    ):  # fmt: skip
        answer = client.get("/api/experiments/", {"sort": sort, "page": forged(sort, value, pk)})
        assert answer.status_code == 400, (sort, value, pk, answer.content)
        assert "cursor" in answer.json()["error"]
