"""Notifications when a run ends: opt-in per user, email through Django's mail, a webhook signed
with HMAC-SHA256 and retried with backoff by a Celery task, never blocking the run's settle; a
sweep for what was lost, and no webhooks to internal addresses."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import urllib3
from django.core import mail
from django.core.mail import BadHeaderError
from django.test import Client
from django.utils import timezone

from dashboard import celery_app
from dashboard.experiments.core import transitions
from dashboard.experiments.models import Status
from dashboard.notifications import delivery as delivery_module
from dashboard.notifications import services, tasks, webhooks
from dashboard.notifications.delivery import SIGNATURE_HEADER
from dashboard.notifications.models import Delivery, DeliveryState, NotificationSettings
from dashboard.notifications.services import notifications_queue
from dashboard.notifications.verification import VERIFY_MAILS_PER_HOUR

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
    # The keys as the app reads them from Django's settings (namespace CELERY): a plain
    # `conf.task_always_eager = ...` is shadowed by them.
    keys = ("CELERY_TASK_ALWAYS_EAGER", "CELERY_TASK_EAGER_PROPAGATES")
    before = {key: conf.changes[key] for key in keys if key in conf.changes}
    # Not propagating: celery then re-applies a task that asks for a retry, as a worker would.
    conf.update(CELERY_TASK_ALWAYS_EAGER=True, CELERY_TASK_EAGER_PROPAGATES=False)
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.TRAINYARD_PUBLIC_URL = "https://trainyard.example"
    # The receiver listens on 127.0.0.1; tests of the refusal turn this off again.
    settings.TRAINYARD_WEBHOOK_ALLOW_PRIVATE = True
    yield
    for key in keys:  # as it was: the change undone, not overwritten with a default
        conf.changes.pop(key, None)
    conf.update(before)


def signature_valid(*, secret: str, header: str, body: bytes, tolerance: float = 300) -> bool:
    """What a receiver does (docs/guides/notifications.md): the HMAC of `<t>.<body>`, and a
    recent t."""
    fields = dict(part.split("=", 1) for part in header.split(","))
    signed = fields["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(fields["t"])) <= tolerance
    return fresh and hmac.compare_digest(fields["sha256"], expected)


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


def opt_in(user: Any, *, verified: bool = True, **fields: Any) -> NotificationSettings:
    """The user's choices; their address verified (as its mailed link does), unless not."""
    prefs, _ = NotificationSettings.objects.get_or_create(user=user)
    for key, value in fields.items():
        setattr(prefs, key, value)
    if verified:
        prefs.email_verified, prefs.email_verified_at = prefs.email_address, timezone.now()
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
    header = headers[SIGNATURE_HEADER]
    assert signature_valid(secret=prefs.webhook_secret, header=header, body=body)
    # The time is signed: a captured message is refused later, or with another time.
    assert not signature_valid(secret="wrong", header=header, body=body)
    assert not signature_valid(secret=prefs.webhook_secret, header=header, body=body, tolerance=-1)
    stamp = int(header.split(",")[0].removeprefix("t="))
    moved = header.replace(f"t={stamp}", f"t={stamp + 1}")
    assert not signature_valid(secret=prefs.webhook_secret, header=moved, body=body)
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
    # Only the status: the reply's body ("try later") is never kept or shown.
    assert delivery.state == DeliveryState.FAILED and delivery.last_error == "HTTP 503"

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


def test_settings_page(user_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # hooks.example is made to resolve to a public address (no DNS in the tests).
    monkeypatch.setattr(webhooks, "host_addresses", lambda host, port: ["93.184.215.14"])
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


def test_a_transition_into_an_end_announces_through_the_signal(
    user_factory: Any, experiment_factory: Any, django_capture_on_commit_callbacks: Any
) -> None:
    alice = user_factory(email="alice@example.com")
    opt_in(alice, email_enabled=True)
    run = finished_run(experiment_factory, alice, status=Status.LOST, finished_at=None)
    with django_capture_on_commit_callbacks(execute=True):
        moved = transitions.experiment_give_up(
            experiment_id=run.pk, error="attempts used up", now=timezone.now()
        )
    assert moved and len(mail.outbox) == 1 and "failed" in mail.outbox[0].subject


def test_a_name_with_a_newline_still_gets_its_email(
    user_factory: Any, experiment_factory: Any, announce: Any
) -> None:
    alice = user_factory(email="alice@example.com")
    opt_in(alice, email_enabled=True)
    run = finished_run(experiment_factory, alice)
    run.name = "ddp\r\non  mnist"
    run.save()
    announce(run)
    (message,) = mail.outbox
    assert "“ddp on mnist”" in message.subject


def test_a_bad_header_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, user_factory: Any, experiment_factory: Any, announce: Any
) -> None:
    calls = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        raise BadHeaderError("Header values can't contain newlines")

    monkeypatch.setattr(delivery_module, "send_mail", refuse)
    alice = user_factory(email="alice@example.com")
    opt_in(alice, email_enabled=True)
    announce(finished_run(experiment_factory, alice))
    delivery = Delivery.objects.get()
    assert len(calls) == 1 and delivery.attempts == 1
    assert delivery.state == DeliveryState.FAILED and "BadHeaderError" in delivery.last_error


# --- no webhooks to internal addresses -----------------------------------------------------------


def test_the_form_refuses_an_internal_address_and_says_why(
    settings: Any, monkeypatch: pytest.MonkeyPatch, user_factory: Any
) -> None:
    settings.TRAINYARD_WEBHOOK_ALLOW_PRIVATE = False
    resolved = {
        "metadata.example": ["169.254.169.254"],
        "mixed.example": ["93.184.215.14", "10.1.2.3"],
    }
    real = webhooks.host_addresses  # address literals resolve to themselves, without DNS
    monkeypatch.setattr(
        webhooks, "host_addresses", lambda host, port: resolved.get(host) or real(host, port)
    )
    client = Client()
    client.force_login(user_factory())
    for url, why in [
        ("http://127.0.0.1:8000/admin/", "127.0.0.1 is not a public internet address"),
        ("http://[::1]/hook", "::1 is not a public internet address"),
        ("https://metadata.example/", "resolves to 169.254.169.254, which is not a public"),
        ("https://mixed.example/", "resolves to 10.1.2.3, which is not a public"),
    ]:
        page = client.post("/notifications/", {"webhook_enabled": "on", "webhook_url": url})
        assert page.status_code == 200 and why in page.content.decode(), url
    assert not NotificationSettings.objects.filter(webhook_enabled=True).exists()


def test_a_name_that_resolves_inside_at_send_time_is_not_called(
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    user_factory: Any,
    experiment_factory: Any,
    receiver: Receiver,
    announce: Any,
) -> None:
    """Saved while public, resolved to 127.0.0.1 when called (DNS rebinding): refused, for good."""
    settings.TRAINYARD_WEBHOOK_ALLOW_PRIVATE = False
    monkeypatch.setattr(webhooks, "host_addresses", lambda host, port: ["127.0.0.1"])
    alice = user_factory()
    port = receiver.url.split(":")[2].split("/")[0]
    opt_in(alice, webhook_enabled=True, webhook_url=f"http://rebind.example:{port}/hook")
    announce(finished_run(experiment_factory, alice))
    delivery = Delivery.objects.get()
    assert receiver.got == [] and delivery.state == DeliveryState.FAILED
    assert "rebind.example resolves to 127.0.0.1" in delivery.last_error


def test_the_call_goes_to_the_address_checked_with_the_name_as_host(
    monkeypatch: pytest.MonkeyPatch,
    user_factory: Any,
    experiment_factory: Any,
    receiver: Receiver,
    announce: Any,
) -> None:
    asked = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    monkeypatch.setattr(webhooks, "host_addresses", resolve)
    alice = user_factory()
    port = receiver.url.split(":")[2].split("/")[0]
    opt_in(alice, webhook_enabled=True, webhook_url=f"http://hooks.example:{port}/hook?x=1")
    announce(finished_run(experiment_factory, alice))
    ((headers, _),) = receiver.got
    assert asked == ["hooks.example"] and headers["Host"] == f"hooks.example:{port}"
    assert Delivery.objects.get().state == DeliveryState.SENT


@pytest.fixture
def tls_receiver(tmp_path: Any, receiver: Receiver) -> Iterator[tuple[int, str]]:
    """The receiver's handler behind TLS with a certificate for hooks.test from a test CA: the
    port and the CA's file."""
    import ssl
    import subprocess

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)  # noqa: S603, S607

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "1", "-subj", "/CN=test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "host.key", "-out", "host.csr",
            "-subj", "/CN=hooks.test")  # fmt: skip
    (tmp_path / "san.cnf").write_text("subjectAltName=DNS:hooks.test\n")
    openssl("x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "host.pem", "-days", "1", "-extfile", "san.cnf")  # fmt: skip
    plain_port = int(receiver.url.split(":")[2].split("/")[0])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "host.pem", tmp_path / "host.key")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_of(plain_port))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], str(tmp_path / "ca.pem")
    server.shutdown()
    server.server_close()


def _handler_of(plain_port: int) -> Any:
    """A handler that passes each POST on to the plain receiver, so its `got` sees it."""
    import http.client

    class Relay(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            relay = http.client.HTTPConnection("127.0.0.1", plain_port, timeout=10)
            relay.request("POST", self.path, body=body, headers=dict(self.headers))
            status = relay.getresponse().status
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Relay


def test_https_webhooks_verify_the_name_of_the_url_not_the_address(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, tls_receiver: tuple[int, str]
) -> None:
    port, ca = tls_receiver
    monkeypatch.setattr(webhooks, "host_addresses", lambda host, port: ["127.0.0.1"])
    monkeypatch.setattr(webhooks, "DEFAULT_CA_BUNDLE_PATH", ca)
    status = webhooks.webhook_post(
        f"https://hooks.test:{port}/hook", body=b"{}", headers={}, timeout=10
    )
    assert status == 200 and receiver.got[0][0]["Host"] == f"hooks.test:{port}"
    # The same address under a name its certificate does not have: refused by TLS.
    with pytest.raises(urllib3.exceptions.SSLError):
        webhooks.webhook_post(f"https://other.test:{port}/hook", body=b"{}", headers={}, timeout=10)
    assert len(receiver.got) == 1


# --- the sweep: announcements and retries lost with a broker or a worker ------------------------


def test_the_sweep_announces_a_run_whose_announcement_was_lost(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice, bob = user_factory(email="a@example.com"), user_factory(email="b@example.com")
    opt_in(alice, email_enabled=True)
    ago = timezone.now() - timezone.timedelta(minutes=5)
    lost = finished_run(experiment_factory, alice, finished_at=ago)
    finished_run(experiment_factory, bob, finished_at=ago)  # bob never opted in
    finished_run(experiment_factory, alice, status=Status.RUNNING, finished_at=None)
    finished_run(experiment_factory, alice, finished_at=timezone.now() - timezone.timedelta(days=2))
    finished_run(experiment_factory, alice)  # just ended: its own task goes first
    tasks.notifications_sweep()
    (message,) = mail.outbox
    assert f"run #{lost.pk} " in message.subject
    tasks.notifications_sweep()  # announced now: not again
    assert len(mail.outbox) == 1


def test_the_sweep_sends_a_delivery_whose_retry_was_lost(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory(email="a@example.com")
    opt_in(alice)  # her address verified
    run = finished_run(experiment_factory, alice)
    long_ago = timezone.now() - timezone.timedelta(hours=1)
    fields = {"experiment": run, "user": alice, "target": "a@example.com"}
    stale = Delivery.objects.create(channel="email", attempts=1, claimed_at=long_ago, **fields)
    waiting = Delivery.objects.create(
        channel="webhook", attempts=1, claimed_at=timezone.now(), **fields
    )
    tasks.notifications_sweep()
    stale.refresh_from_db()
    waiting.refresh_from_db()
    assert len(mail.outbox) == 1 and stale.state == DeliveryState.SENT and stale.attempts == 2
    # A retry still waiting out its backoff is left to it.
    assert waiting.state == DeliveryState.PENDING and waiting.attempts == 1


def test_two_copies_of_a_delivery_task_send_once(
    monkeypatch: pytest.MonkeyPatch, user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory(email="a@example.com")
    opt_in(alice)  # her address verified
    run = finished_run(experiment_factory, alice)
    row = Delivery.objects.create(
        experiment=run, user=alice, channel="email", target="a@example.com"
    )
    inner = delivery_module._email_send

    def send_while_a_twin_tries(delivery: Any) -> Any:
        # The twin arrives while this one is sending: the row is claimed, so it backs off.
        assert delivery_module.delivery_attempt(delivery_id=delivery.pk).attempts == 0
        return inner(delivery)

    monkeypatch.setattr(delivery_module, "_email_send", send_while_a_twin_tries)
    tasks.delivery_send(row.pk)
    tasks.delivery_send(row.pk)  # a copy after it was sent: nothing
    row.refresh_from_db()
    assert len(mail.outbox) == 1 and row.state == DeliveryState.SENT and row.attempts == 1


# --- mail only to verified addresses -------------------------------------------------------------


LINK = re.compile(r"https://trainyard\.example(/notifications/verify/[^/\s]+/)")


def test_the_sweep_mails_a_verified_address_and_not_an_unverified_one(
    user_factory: Any, experiment_factory: Any, receiver: Receiver
) -> None:
    alice, bob = user_factory(email="a@example.com"), user_factory(email="b@example.com")
    # Alice's address was never verified (anyone's, typed in); her webhook is her own.
    opt_in(
        alice, verified=False, email_enabled=True, webhook_enabled=True, webhook_url=receiver.url
    )
    opt_in(bob, email_enabled=True)
    ago = timezone.now() - timezone.timedelta(minutes=5)
    finished_run(experiment_factory, alice, finished_at=ago)
    bobs = finished_run(experiment_factory, bob, finished_at=ago)
    tasks.notifications_sweep()
    (message,) = mail.outbox
    assert message.to == ["b@example.com"] and f"run #{bobs.pk} " in message.subject
    assert len(receiver.got) == 1  # webhooks are unaffected
    assert not Delivery.objects.filter(user=alice, channel="email").exists()


def test_a_changed_address_is_unverified_and_a_delivery_made_before_is_not_sent(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory(email="a@example.com")
    prefs = opt_in(alice, email_enabled=True)
    run = finished_run(experiment_factory, alice)
    old = Delivery.objects.create(
        experiment=run, user=alice, channel="email", target="a@example.com"
    )
    prefs.email = "victim@example.org"  # now hers to verify again
    prefs.save()
    announce_run = finished_run(experiment_factory, alice)
    tasks.run_end_notify(announce_run.pk)
    tasks.delivery_send(old.pk)  # made for the old address (or before addresses were verified)
    old.refresh_from_db()
    assert mail.outbox == [] and old.state == DeliveryState.FAILED
    assert old.last_error == delivery_module.UNVERIFIED
    assert not Delivery.objects.filter(experiment=announce_run).exists()


def test_the_page_says_unverified_and_the_mailed_link_verifies(
    settings: Any, user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory(username="alice", email="alice@example.com")
    opt_in(alice, verified=False, email_enabled=True)
    client = Client()
    client.force_login(alice)
    page = client.get("/notifications/").content.decode()
    assert "alice@example.com is not verified" in page and "Send verification" in page
    sent = client.post("/notifications/verify/", follow=True)
    assert "A link is on its way to alice@example.com" in sent.content.decode()
    (message,) = mail.outbox
    assert message.to == ["alice@example.com"] and "alice" in message.body
    path = LINK.search(message.body).group(1)  # type: ignore[union-attr]

    # Not by a changed or a forged link, nor by another account, nor after it expired.
    mallory = Client()
    mallory.force_login(user_factory())
    said = mallory.get(path, follow=True).content.decode()
    assert "another account" in said
    forged = client.get(path.replace("/verify/", "/verify/x"), follow=True).content.decode()
    assert "not one we sent" in forged
    settings.TRAINYARD_EMAIL_VERIFY_SECONDS = -1
    assert "expired" in client.get(path, follow=True).content.decode()
    assert not NotificationSettings.objects.get(user=alice).email_address_verified
    settings.TRAINYARD_EMAIL_VERIFY_SECONDS = 3600

    page = client.get(path, follow=True).content.decode()
    assert "Address verified" in page and "alice@example.com is verified" in page
    prefs = NotificationSettings.objects.get(user=alice)
    assert prefs.email_verified == "alice@example.com" and prefs.email_verified_at is not None
    ago = timezone.now() - timezone.timedelta(minutes=5)
    finished_run(experiment_factory, alice, finished_at=ago)
    tasks.notifications_sweep()
    assert [m.to for m in mail.outbox] == [["alice@example.com"], ["alice@example.com"]]


def test_verification_mails_are_few(user_factory: Any) -> None:
    alice = user_factory(email="a@example.com")
    opt_in(alice, verified=False, email_enabled=True)
    client = Client()
    client.force_login(alice)
    for _ in range(VERIFY_MAILS_PER_HOUR):
        client.post("/notifications/verify/")
    refused = client.post("/notifications/verify/", follow=True).content.decode()
    assert len(mail.outbox) == VERIFY_MAILS_PER_HOUR and "try again in 60 minutes" in refused


# --- end to end: a real run on the stack announces its end ------------------------------------


@pytest.mark.integration
@pytest.mark.sqlite_only  # the deliveries' rows and retries are this file's other tests, on both
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
    # Her address gets mail once she opens the link a worker mailed to it (printed on its console).
    sent = dora.post(f"{url}verify/", timeout=10, allow_redirects=False)
    assert sent.status_code == 302
    link = re.compile(r"http://127\.0\.0\.1:8000(/notifications/verify/[^/\s]+/)")
    wait_for(
        lambda: link.search(stack.services["worker"].log_tail(400)),
        timeout=60,
        what="the verification mail",
    )
    path = link.search(stack.services["worker"].log_tail(400)).group(1)  # type: ignore[union-attr]
    assert "is verified" in dora.get(f"{stack.base_url}{path}", timeout=10).text
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
    assert signature_valid(secret=secret, header=headers[SIGNATURE_HEADER], body=body)
    payload = json.loads(body)["experiment"]
    assert payload["id"] == pk and payload["status"] == "succeeded"
    assert payload["test_accuracy"] > 0.5
    # Django's console backend: the worker printed the mail.
    worker_log = stack.services["worker"].log_tail(400)
    assert "To: dora@example.com" in worker_log and f"Run #{pk} " in worker_log
