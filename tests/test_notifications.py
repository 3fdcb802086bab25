"""Notifications when a run ends: opt-in per user, email through Django's mail, a webhook signed
with HMAC-SHA256 and retried with backoff by a Celery task, never blocking the run's settle."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from dashboard import celery_app
from dashboard.experiments.models import Status
from dashboard.notifications import services
from dashboard.notifications.delivery import SIGNATURE_HEADER
from dashboard.notifications.models import Delivery, DeliveryState, NotificationSettings
from dashboard.notifications.services import notifications_queue

pytestmark = pytest.mark.django_db


@dataclass
class Receiver:
    """A webhook receiver on 127.0.0.1: answers each POST with the next status of `answers`
    (the last one repeats) and keeps what it got."""

    answers: list[int]
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(answers=[200])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.got.append((dict(self.headers), body))
            status = state.answers[min(len(state.got), len(state.answers)) - 1]
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok" if status < 300 else b"try later")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def eager(settings: Any) -> Iterator[None]:
    """Tasks run in this process as they are queued; retries run at once (no countdown)."""
    conf = celery_app.conf
    before = (conf.task_always_eager, conf.task_eager_propagates)
    # Not propagating: celery then re-applies a task that asks for a retry, as a worker would.
    conf.task_always_eager, conf.task_eager_propagates = True, False
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.TRAINYARD_PUBLIC_URL = "https://trainyard.example"
    yield
    conf.task_always_eager, conf.task_eager_propagates = before


def finished_run(experiment_factory: Any, owner: Any, **fields: Any) -> Any:
    values = {
        "status": Status.SUCCEEDED,
        "test_accuracy": 0.9734,
        "test_loss": 0.0912,
        "started_at": timezone.now() - timezone.timedelta(seconds=65),
        "finished_at": timezone.now(),
        "worker": "host-a",
        **fields,
    }
    return experiment_factory(owner=owner, name="ddp on mnist", **values)


def opt_in(user: Any, **fields: Any) -> NotificationSettings:
    prefs, _ = NotificationSettings.objects.get_or_create(user=user)
    for key, value in fields.items():
        setattr(prefs, key, value)
    prefs.save()
    return prefs


@pytest.fixture
def announce(django_capture_on_commit_callbacks: Any) -> Any:
    """Call the hook as a status transition would, inside a transaction that then commits."""

    def call(run: Any) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            notifications_queue(experiment_id=run.pk)

    return call


def test_email_says_how_the_run_ended_its_accuracy_and_a_link(
    user_factory: Any, experiment_factory: Any, announce: Any
) -> None:
    alice = user_factory(email="alice@example.com")
    opt_in(alice, email_enabled=True)
    run = finished_run(experiment_factory, alice)
    announce(run)
    (message,) = mail.outbox
    assert message.to == ["alice@example.com"]
    assert "succeeded" in message.subject and "97.3%" in message.subject
    assert "Test accuracy: 97.34%" in message.body
    assert f"https://trainyard.example/experiments/{run.pk}/" in message.body
    delivery = Delivery.objects.get()
    assert delivery.state == DeliveryState.SENT and delivery.attempts == 1
    # Once per run: a second call (a twin task) sends nothing more.
    announce(run)
    assert len(mail.outbox) == 1


def test_failed_and_cancelled_runs_say_why(
    user_factory: Any, experiment_factory: Any, announce: Any
) -> None:
    alice = user_factory()
    opt_in(alice, email_enabled=True, email="ops@example.com")
    failed = finished_run(
        experiment_factory, alice, status=Status.FAILED, test_accuracy=None, error="CUDA OOM"
    )
    stopped = finished_run(
        experiment_factory, alice, status=Status.CANCELLED, error="stopped by alice"
    )
    announce(failed)
    announce(stopped)
    first, second = mail.outbox
    assert "failed" in first.subject and "Why: CUDA OOM" in first.body
    assert "did not reach an evaluation" in first.body
    assert "cancelled" in second.subject and "stopped by alice" in second.body


def test_nothing_without_opt_in_or_before_the_end(
    user_factory: Any,
    experiment_factory: Any,
    receiver: Receiver,
    announce: Any,
) -> None:
    alice, bob = user_factory(email="a@example.com"), user_factory(email="b@example.com")
    opt_in(bob, email_enabled=True, webhook_enabled=True, webhook_url=receiver.url)
    announce(finished_run(experiment_factory, alice))
    announce(finished_run(experiment_factory, bob, status=Status.RUNNING))
    assert mail.outbox == [] and receiver.got == [] and not Delivery.objects.exists()


def test_webhook_is_signed_and_retried_after_a_500(
    user_factory: Any,
    experiment_factory: Any,
    receiver: Receiver,
    announce: Any,
) -> None:
    receiver.answers = [500, 200]
    alice = user_factory()
    prefs = opt_in(alice, webhook_enabled=True, webhook_url=receiver.url)
    run = finished_run(experiment_factory, alice)
    announce(run)
    assert len(receiver.got) == 2
    (headers, body), (headers_again, body_again) = receiver.got
    assert (
        body == body_again
        and headers["X-Trainyard-Delivery"] == headers_again["X-Trainyard-Delivery"]
    )
    expected = hmac.new(prefs.webhook_secret.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers[SIGNATURE_HEADER], f"sha256={expected}")
    payload = json.loads(body)
    assert payload["event"] == "run.ended"
    assert payload["experiment"]["status"] == "succeeded"
    assert payload["experiment"]["test_accuracy"] == pytest.approx(0.9734)
    assert payload["experiment"]["url"] == f"https://trainyard.example/experiments/{run.pk}/"
    assert "97.34%" in payload["text"]
    delivery = Delivery.objects.get()
    assert delivery.state == DeliveryState.SENT and delivery.attempts == 2


def test_webhook_gives_up_after_its_retries_and_on_a_4xx(
    settings: Any,
    user_factory: Any,
    experiment_factory: Any,
    receiver: Receiver,
    announce: Any,
) -> None:
    settings.TRAINYARD_NOTIFY_MAX_RETRIES = 2
    receiver.answers = [503]
    alice = user_factory()
    opt_in(alice, webhook_enabled=True, webhook_url=receiver.url)
    announce(finished_run(experiment_factory, alice))
    assert len(receiver.got) == 3  # the first try and two retries
    delivery = Delivery.objects.get()
    assert delivery.state == DeliveryState.FAILED and "HTTP 503" in delivery.last_error

    receiver.answers, receiver.got = [404], []
    announce(finished_run(experiment_factory, alice))
    assert len(receiver.got) == 1  # a 404 will not change by itself: no retry


def test_queueing_never_raises_into_the_run(
    monkeypatch: pytest.MonkeyPatch,
    user_factory: Any,
    experiment_factory: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(services.run_end_notify, "apply_async", broker_down)
    run = finished_run(experiment_factory, user_factory())
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        notifications_queue(experiment_id=run.pk)
    assert len(callbacks) == 1  # queued on commit, and its failure only logged


def test_settings_page(user_factory: Any) -> None:
    alice = user_factory()
    client = Client()
    client.force_login(alice)
    page = client.get("/notifications/")
    secret = NotificationSettings.objects.get(user=alice).webhook_secret
    assert page.status_code == 200 and secret in page.content.decode()
    refused = client.post("/notifications/", {"webhook_enabled": "on", "email_enabled": "on"})
    text = refused.content.decode()
    assert refused.status_code == 200 and "give the URL" in text and "no address" in text
    saved = client.post(
        "/notifications/",
        {"webhook_enabled": "on", "webhook_url": "https://hooks.example/run", "email": ""},
    )
    assert saved.status_code == 302
    prefs = NotificationSettings.objects.get(user=alice)
    assert prefs.webhook_enabled and prefs.webhook_url == "https://hooks.example/run"
    client.post("/notifications/secret/")
    prefs.refresh_from_db()
    assert prefs.webhook_secret != secret


# --- end to end: a real run on the stack announces its end ------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_real_run_ends_with_an_email_and_a_signed_webhook(stack: Any, receiver: Receiver) -> None:
    from tests.stack import wait_for

    receiver.answers = [500, 200]  # the worker retries after its backoff
    stack.user_create("dora")
    dora = stack.login("dora")
    url = f"{stack.base_url}/notifications/"
    assert dora.get(url, timeout=10).status_code == 200
    form = {
        "email_enabled": "on",
        "email": "dora@example.com",
        "webhook_enabled": "on",
        "webhook_url": receiver.url,
    }
    assert dora.post(url, data=form, timeout=10, allow_redirects=False).status_code == 302
    ((secret,),) = stack.query(
        "SELECT webhook_secret FROM notifications_notificationsettings n"
        " JOIN auth_user u ON u.id = n.user_id WHERE u.username = 'dora'"
    )
    launched = dora.post(
        f"{stack.base_url}/api/experiments/", json={"strategy": "single", "epochs": 1}, timeout=10
    )
    pk = launched.json()["id"]
    wait_for(
        lambda: stack.experiment_row(pk)["status"] in {"succeeded", "failed"},
        timeout=180,
        what="the run to end",
    )
    wait_for(lambda: len(receiver.got) >= 2, timeout=60, what="the webhook and its retry")
    headers, body = receiver.got[-1]
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == f"sha256={expected}"
    payload = json.loads(body)["experiment"]
    assert payload["id"] == pk and payload["status"] == "succeeded"
    assert payload["test_accuracy"] > 0.5
    # Django's console backend: the worker printed the mail.
    worker_log = stack.services["worker"].log_tail(400)
    assert "To: dora@example.com" in worker_log and f"Run #{pk} " in worker_log
