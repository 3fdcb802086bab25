"""The JSON API: validation, defaults, authentication, CSRF and ownership."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from dashboard.accounts.models import ApiToken
from dashboard.experiments.models import Experiment

pytestmark = pytest.mark.django_db


def post(client: Client, path: str, body: Any, **headers: str) -> Any:
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(path, raw, content_type="application/json", **headers)


@pytest.fixture
def alice_client(user_factory: Any) -> Client:
    client = Client()
    client.force_login(user_factory(username="alice"))
    return client


def test_create_uses_defaults_and_queues(
    alice_client: Client, launched: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = post(alice_client, "/api/experiments/", {"strategy": "ddp"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "queued" and body["processes"] == 2 and body["epochs"] == 1
    assert body["batch_size"] == 64 and body["optimizer"] == "adam" and body["gpus"] == []
    assert launched == [body["id"]]
    assert Experiment.objects.get(pk=body["id"]).owner.username == "alice"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": "3"}, "epochs"),
        ({"epochs": True}, "epochs"),
        ({"batch_size": 100_000}, "batch_size"),
        ({"lr": 0}, "lr"),
        ({"lr": -1}, "lr"),
        ({"strategy": "horovod"}, "strategy"),
        ({"dataset": "cifar"}, "dataset"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"gpus": ["a"]}, "gpus"),
        ({"gpus": [7]}, "gpus"),
        ({"processes": 999}, "processes"),
        ({"strategy": "ddp", "processes": 64}, "processes"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_input_is_refused_with_the_field(
    alice_client: Client, launched: list[int], payload: dict[str, Any], field: str
) -> None:
    response = post(alice_client, "/api/experiments/", payload)
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors and errors[field][0], errors
    assert not Experiment.objects.exists() and not launched


@pytest.mark.parametrize(
    ("payload", "message"),
    [({"lr": "abc"}, "must be a number"), ({"epochs": 2.5}, "must be an integer")],
)
def test_a_value_of_the_wrong_type_is_named_by_its_type(
    alice_client: Client, payload: dict[str, Any], message: str
) -> None:
    response = post(alice_client, "/api/experiments/", payload)
    assert response.json()["errors"][next(iter(payload))] == [message]


def test_too_many_processes_says_what_is_available(alice_client: Client) -> None:
    response = post(alice_client, "/api/experiments/", {"strategy": "ddp", "processes": 64})
    message = response.json()["errors"]["processes"][0]
    assert "64" in message and "CPU" in message, message


@pytest.mark.parametrize("body", ["not json", "[1, 2]", "x" * 70_000])
def test_malformed_bodies_get_json_errors(alice_client: Client, body: str) -> None:
    response = post(alice_client, "/api/experiments/", body)
    assert response.status_code in {400, 413}
    assert response.json()["error"]


def test_anonymous_gets_401_json() -> None:
    response = Client().get("/api/experiments/")
    assert response.status_code == 401 and "login" in response.json()["error"]


def test_session_post_needs_csrf(user_factory: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user_factory())
    response = post(client, "/api/experiments/", {})
    assert response.status_code == 403 and "CSRF" in response.json()["error"]


def test_token_keys_never_read_as_a_command_line_option() -> None:
    from dashboard.accounts.models import new_token_key

    keys = {new_token_key() for _ in range(2000)}
    assert len(keys) == 2000 and all(k.startswith("ty_") and len(k) <= 64 for k in keys)


def test_token_auth_needs_no_csrf(user_factory: Any, launched: list[int]) -> None:
    token = ApiToken.objects.create(user=user_factory(username="script"))
    client = Client(enforce_csrf_checks=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token.key}"}
    response = post(client, "/api/experiments/", {"strategy": "single"}, **auth)
    assert response.status_code == 201, response.content
    assert client.get("/api/experiments/", HTTP_AUTHORIZATION="Bearer nope").status_code == 401


def test_users_see_and_stop_only_their_own(user_factory: Any, experiment_factory: Any) -> None:
    alice, bob, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = experiment_factory(owner=alice)
    bob_client, staff_client = Client(), Client()
    bob_client.force_login(bob)
    staff_client.force_login(staff)
    assert bob_client.get(f"/api/experiments/{run.pk}/").status_code == 404
    assert bob_client.post(f"/api/experiments/{run.pk}/stop/").status_code == 404
    assert bob_client.get("/api/experiments/").json()["experiments"] == []
    assert staff_client.get(f"/api/experiments/{run.pk}/").json()["owner"] == alice.username
    response = staff_client.post(f"/api/experiments/{run.pk}/stop/")
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    assert staff_client.post(f"/api/experiments/{run.pk}/stop/").status_code == 409


def test_stop_of_a_running_run_is_a_request(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status="running")
    client = Client()
    client.force_login(alice)
    body = client.post(f"/api/experiments/{run.pk}/stop/").json()
    assert body["status"] == "running" and body["stop_requested"] is True


def test_metrics_endpoint(user_factory: Any, experiment_factory: Any) -> None:
    from dashboard.experiments.models import SeriesPoint

    alice = user_factory()
    run = experiment_factory(owner=alice, run_info={"global_batch_size": 128})
    SeriesPoint.objects.create(experiment=run, key="train_loss", step=10, time=1.0, value=0.5)
    client = Client()
    client.force_login(alice)
    body = client.get(f"/api/experiments/{run.pk}/metrics/").json()
    assert body == {
        "id": run.pk,
        "budget": 1000,
        "step_range": None,
        "global_batch_size": 128,
        "series": {
            "train_loss": {"count": 1, "buckets": [[10, 10, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1]]}
        },
    }
    raw = client.get(f"/api/experiments/{run.pk}/metrics/?raw=1").json()
    assert raw == {"id": run.pk, "series": {"train_loss": [[10, 1.0, 0.5]]}, "next": None}
