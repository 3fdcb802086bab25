"""Tokens for everyone: made on the Tokens page (the key shown once), stored hashed, used,
revoked by their owner or by staff (a revoked key gets 401 at once), and on the WebSocket."""

from __future__ import annotations

import hashlib
import io
import re
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone

from dashboard.accounts.models import ApiToken
from dashboard.accounts.services import token_authenticate, token_create, token_revoke

pytestmark = pytest.mark.django_db
KEY = re.compile(r"ty_[A-Za-z0-9_-]{43}")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def bearer(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_page_makes_a_token_shown_once_that_works(user_factory: Any) -> None:
    alice = user_factory()
    client = logged_in(alice)
    page = client.post("/accounts/tokens/", {"name": "laptop"})
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    (key,) = set(KEY.findall(page.content.decode()))
    token = ApiToken.objects.get(user=alice)
    assert token.name == "laptop" and key.startswith(token.prefix)
    # Stored as a hash, never the key itself.
    assert token.key_hash == hashlib.sha256(key.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_apitoken")
        assert key not in repr(cursor.fetchall())
    again = client.get("/accounts/tokens/").content.decode()
    assert key not in again and token.prefix in again and "never" in again

    assert Client().get("/api/experiments/", **bearer(key)).status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None
    assert "ago" in client.get("/accounts/tokens/").content.decode()


def test_the_page_never_puts_the_key_on_a_command_line(user_factory: Any) -> None:
    page = logged_in(user_factory()).post("/accounts/tokens/", {"name": "ci"}).content.decode()
    (key,) = set(KEY.findall(page))
    assert page.count(key) == 1  # shown once, to copy; the command reads it from stdin
    assert "--token-stdin" in page and "--token " not in page


def test_last_used_is_written_at_most_once_a_minute(user_factory: Any) -> None:
    token, key = token_create(user=user_factory())
    recent = timezone.now() - timedelta(seconds=30)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=recent)
    assert token_authenticate(key=key) is not None
    token.refresh_from_db()
    assert token.last_used_at == recent  # used within the minute: not written again
    old = timezone.now() - timedelta(seconds=61)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=old)
    assert token_authenticate(key=key) is not None
    token.refresh_from_db()
    assert token.last_used_at is not None and token.last_used_at > recent


def test_revoked_token_gets_401_at_once(user_factory: Any) -> None:
    alice = user_factory()
    # A name no page text contains ("ci" is in "precision", which the page facts carry).
    token, key = token_create(user=alice, name="nightly-ci-7f3q")
    assert Client().get("/api/experiments/", **bearer(key)).status_code == 200
    assert "nightly-ci-7f3q" in logged_in(alice).get("/accounts/tokens/").content.decode()
    response = logged_in(alice).post(f"/accounts/tokens/{token.pk}/revoke/")
    assert response.status_code == 302
    refused = Client().get("/api/experiments/", **bearer(key))
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]
    assert "nightly-ci-7f3q" not in logged_in(alice).get("/accounts/tokens/").content.decode()


def test_others_cannot_revoke_and_staff_revoke_in_the_admin(user_factory: Any) -> None:
    alice, bob = user_factory(), user_factory()
    admin_user = user_factory(staff=True, is_superuser=True)
    # A name no page text contains ("ci" is in "precision", which the page facts carry).
    token, key = token_create(user=alice, name="nightly-ci-7f3q")
    assert logged_in(bob).post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404
    assert Client().get("/api/experiments/", **bearer(key)).status_code == 200
    staff = logged_in(admin_user)
    listing = staff.get("/admin/accounts/apitoken/")
    assert listing.status_code == 200 and token.prefix in listing.content.decode()
    assert staff.get("/admin/accounts/apitoken/add/").status_code == 403
    staff.post("/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_by == admin_user
    assert Client().get("/api/experiments/", **bearer(key)).status_code == 401


def test_inactive_users_tokens_stop_working(user_factory: Any) -> None:
    alice = user_factory()
    _, key = token_create(user=alice)
    alice.is_active = False
    alice.save()
    assert Client().get("/api/experiments/", **bearer(key)).status_code == 401


def test_create_token_prints_a_usable_key(user_factory: Any) -> None:
    user_factory(username="script")
    out = io.StringIO()
    call_command("create_token", "script", "--name", "nightly", stdout=out)
    key = out.getvalue().strip()
    assert KEY.fullmatch(key)
    assert Client().get("/api/experiments/", **bearer(key)).status_code == 200
    assert ApiToken.objects.get().name == "nightly"


def test_api_trades_a_password_for_a_token(user_factory: Any) -> None:
    user_factory(username="carol")
    client = Client(enforce_csrf_checks=True)
    good = {"username": "carol", "password": "pw-carol", "name": "cli"}
    response = client.post("/api/tokens/", good, content_type="application/json")
    assert response.status_code == 201, response.content
    key = response.json()["token"]
    assert Client().get("/api/experiments/", **bearer(key)).status_code == 200
    wrong = {**good, "password": "nope"}
    assert client.post("/api/tokens/", wrong, content_type="application/json").status_code == 401
    assert client.get("/api/tokens/").status_code == 401
    bad_name = {**good, "name": 3}
    assert client.post("/api/tokens/", bad_name, content_type="application/json").status_code == 400
    assert ApiToken.objects.count() == 1


def test_api_tokens_are_rate_limited_like_launches(user_factory: Any, settings: Any) -> None:
    settings.TRAINYARD_TOKEN_RATE_PER_MINUTE = 2
    user_factory(username="dave")
    client = Client()
    good = {"username": "dave", "password": "pw-dave"}
    for _ in range(2):
        response = client.post("/api/tokens/", good, content_type="application/json")
        assert response.status_code == 201, response.content
    refused = client.post("/api/tokens/", good, content_type="application/json")
    assert refused.status_code == 429
    body = refused.json()
    assert body["limit"] == "token_rate" and 1 <= body["retry_after"] <= 60
    assert refused["Retry-After"] == str(body["retry_after"])
    assert "TRAINYARD_TOKEN_RATE_PER_MINUTE" in body["error"]
    assert ApiToken.objects.count() == 2
    # A minute later the oldest no longer counts.
    ApiToken.objects.update(created_at=timezone.now() - timedelta(seconds=61))
    assert client.post("/api/tokens/", good, content_type="application/json").status_code == 201


@pytest.mark.django_db(transaction=True)
async def test_websocket_takes_a_bearer_token(user_factory: Any, experiment_factory: Any) -> None:
    from dashboard.asgi import application

    alice = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=alice)
    token, key = await sync_to_async(token_create)(user=alice)

    async def connects(authorization: bytes) -> bool:
        headers = [(b"origin", b"http://localhost"), (b"authorization", authorization)]
        comm = WebsocketCommunicator(application, f"/ws/experiments/{run.pk}/", headers=headers)
        connected, _ = await comm.connect()
        if connected:
            assert (await comm.receive_json_from())["type"] == "snapshot"
        await comm.disconnect()
        return bool(connected)

    assert await connects(f"Bearer {key}".encode())
    assert not await connects(b"Bearer ty_wrong")
    await sync_to_async(ApiToken.objects.filter(pk=token.pk).update)(revoked_at=timezone.now())
    assert not await connects(f"Bearer {key}".encode())


@pytest.mark.django_db(transaction=True)
async def test_revoking_a_token_closes_the_sockets_it_opened(
    user_factory: Any, experiment_factory: Any
) -> None:
    from dashboard.asgi import application

    alice = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=alice)
    token, key = await sync_to_async(token_create)(user=alice)
    other, other_key = await sync_to_async(token_create)(user=alice)

    async def opened(with_key: str) -> WebsocketCommunicator:
        headers = [
            (b"origin", b"http://localhost"),
            (b"authorization", f"Bearer {with_key}".encode()),
        ]
        comm = WebsocketCommunicator(application, f"/ws/experiments/{run.pk}/", headers=headers)
        assert (await comm.connect())[0]
        assert (await comm.receive_json_from())["type"] == "snapshot"
        return comm

    revoked_socket, kept_socket = await opened(key), await opened(other_key)
    assert await sync_to_async(token_revoke)(token=token, by=alice)
    closed = await revoked_socket.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4401}
    assert await kept_socket.receive_nothing(timeout=0.3)
    await kept_socket.disconnect()


@pytest.mark.django_db(transaction=True)
def test_migration_hashes_existing_plain_keys(user_factory: Any) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("accounts", "0001_initial")])
    user = user_factory()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounts_apitoken (key, name, created_at, user_id)"
            " VALUES (%s, %s, %s, %s)",
            ["ty_an-old-plain-key", "old", "2026-01-01 00:00:00", user.pk],
        )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("accounts"))
    token = ApiToken.objects.get(name="old")
    assert token.prefix == "ty_an-ol"
    assert Client().get("/api/experiments/", **bearer("ty_an-old-plain-key")).status_code == 200
