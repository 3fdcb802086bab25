"""Sessions end everywhere (issue 35 item 4): a logout, a password change, a deactivation and a
loss of staff close the user's open sockets at once (and only those that lost access); a password
change ends the other sessions and, if asked, revokes the tokens; tokens expire; sockets check
their login again periodically. In process, through the real ASGI application (session cookie
and bearer token middleware, origin check) with WebsocketCommunicator."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from dashboard.accounts.models import ApiToken
from dashboard.accounts.services import token_create
from dashboard.experiments.core.messages import SocketClose

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://localhost")
NEW_PASSWORD = "a-new-passphrase-9"  # noqa: S105


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def cookie_of(client: Client) -> tuple[bytes, bytes]:
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def communicator(pk: int, credential: tuple[bytes, bytes]) -> WebsocketCommunicator:
    from dashboard.asgi import application

    path = f"/ws/experiments/{pk}/"
    return WebsocketCommunicator(application, path, headers=[ORIGIN, credential])


async def socket_open(pk: int, credential: tuple[bytes, bytes]) -> WebsocketCommunicator:
    comm = communicator(pk, credential)
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from())["type"] == "snapshot"
    return comm


async def closed_with(comm: WebsocketCommunicator) -> int:
    message = await comm.receive_output(timeout=5)
    assert message["type"] == "websocket.close", message
    await comm.disconnect()
    return int(message["code"])


async def stays_open(comm: WebsocketCommunicator) -> bool:
    quiet = await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()
    return bool(quiet)


async def refused(pk: int, credential: tuple[bytes, bytes]) -> bool:
    comm = communicator(pk, credential)
    connected, _ = await comm.connect()
    await comm.disconnect()
    return not connected


def bearer(key: str) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {key}".encode())


async def test_logout_closes_that_sessions_sockets(user_factory: Any, experiment_factory: Any):
    alice = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=alice)
    laptop, phone = await sync_to_async(logged_in)(alice), await sync_to_async(logged_in)(alice)
    on_laptop = await socket_open(run.pk, cookie_of(laptop))
    on_phone = await socket_open(run.pk, cookie_of(phone))
    laptop_cookie = cookie_of(laptop)

    assert (await sync_to_async(laptop.post)("/accounts/logout/")).status_code == 302
    # On main the socket outlived the logout: it went on receiving the run's events.
    assert await closed_with(on_laptop) == SocketClose.UNAUTHENTICATED
    assert await stays_open(on_phone)  # another session of hers, still logged in
    assert await refused(run.pk, laptop_cookie)


async def test_a_password_change_ends_the_other_sessions_and_their_sockets(
    user_factory: Any, experiment_factory: Any
):
    alice = await sync_to_async(user_factory)(username="alice")
    run = await sync_to_async(experiment_factory)(owner=alice)
    here, elsewhere = await sync_to_async(logged_in)(alice), await sync_to_async(logged_in)(alice)
    token, key = await sync_to_async(token_create)(user=alice)
    socket_here = await socket_open(run.pk, cookie_of(here))
    socket_elsewhere = await socket_open(run.pk, cookie_of(elsewhere))
    socket_of_token = await socket_open(run.pk, bearer(key))

    change = {"old_password": "pw-alice", "new_password1": NEW_PASSWORD}
    change["new_password2"] = NEW_PASSWORD
    answer = await sync_to_async(here.post)("/accounts/password_change/", change)
    assert answer.status_code == 302, answer.content[:2000]

    # The other session is over: its socket closes for good, its next page asks for a login.
    assert await closed_with(socket_elsewhere) == SocketClose.UNAUTHENTICATED
    page = await sync_to_async(elsewhere.get)("/accounts/tokens/")
    assert page.status_code == 302 and "/accounts/login/" in page["Location"]
    # This one goes on under a new session key (Django's update_session_auth_hash): its socket,
    # opened with the old key, reconnects and the handshake lets it in.
    assert await closed_with(socket_here) == SocketClose.RESYNC
    assert (await sync_to_async(here.get)("/accounts/tokens/")).status_code == 200
    await (await socket_open(run.pk, cookie_of(here))).disconnect()
    # The tokens were not asked to go.
    assert await stays_open(socket_of_token)
    live = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True)
    assert await sync_to_async(live.exists)()


async def test_a_password_change_revokes_the_tokens_when_asked(
    user_factory: Any, experiment_factory: Any
):
    alice = await sync_to_async(user_factory)(username="alice")
    run = await sync_to_async(experiment_factory)(owner=alice)
    here = await sync_to_async(logged_in)(alice)
    _, key = await sync_to_async(token_create)(user=alice)
    socket_of_token = await socket_open(run.pk, bearer(key))

    change = {"old_password": "pw-alice", "new_password1": NEW_PASSWORD, "revoke_tokens": "on"}
    change["new_password2"] = NEW_PASSWORD
    answer = await sync_to_async(here.post)("/accounts/password_change/", change, follow=True)
    assert "Revoked 1 API token" in answer.content.decode()
    assert await closed_with(socket_of_token) == SocketClose.UNAUTHENTICATED
    api = await sync_to_async(Client().get)("/api/experiments/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.status_code == 401


async def test_deactivation_closes_every_socket_of_the_user(
    user_factory: Any, experiment_factory: Any
):
    alice, bob = await sync_to_async(user_factory)(), await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=alice)
    bobs_run = await sync_to_async(experiment_factory)(owner=bob)
    _, key = await sync_to_async(token_create)(user=alice)
    by_session = await socket_open(run.pk, cookie_of(await sync_to_async(logged_in)(alice)))
    by_token = await socket_open(run.pk, bearer(key))
    bobs = await socket_open(bobs_run.pk, cookie_of(await sync_to_async(logged_in)(bob)))

    alice.is_active = False
    await sync_to_async(alice.save)()  # as the admin's user page does
    assert await closed_with(by_session) == SocketClose.UNAUTHENTICATED
    assert await closed_with(by_token) == SocketClose.UNAUTHENTICATED
    assert await stays_open(bobs)


async def test_losing_staff_closes_the_sockets_on_other_users_runs(
    user_factory: Any, experiment_factory: Any
):
    carol = await sync_to_async(user_factory)(staff=True)
    bob = await sync_to_async(user_factory)()
    bobs_run = await sync_to_async(experiment_factory)(owner=bob)
    her_run = await sync_to_async(experiment_factory)(owner=carol)
    session = cookie_of(await sync_to_async(logged_in)(carol))
    on_bobs = await socket_open(bobs_run.pk, session)
    on_hers = await socket_open(her_run.pk, session)

    carol.is_staff = False
    await sync_to_async(carol.save)()
    assert await closed_with(on_bobs) == SocketClose.FORBIDDEN
    assert await stays_open(on_hers)


async def test_an_expired_token_is_refused_and_its_socket_closes_at_the_periodic_check(
    user_factory: Any, experiment_factory: Any, settings: Any
):
    settings.TRAINYARD_SOCKET_RECHECK_SECONDS = 0.2
    alice = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=alice)
    token, key = await sync_to_async(token_create)(user=alice)
    socket = await socket_open(run.pk, bearer(key))
    # A token reaches its expiry without anyone saving anything: no signal, only the clock.
    past = timezone.now() - timedelta(seconds=1)
    await sync_to_async(ApiToken.objects.filter(pk=token.pk).update)(expires_at=past)

    assert await closed_with(socket) == SocketClose.UNAUTHENTICATED
    api = await sync_to_async(Client().get)("/api/experiments/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.status_code == 401
    assert await refused(run.pk, bearer(key))


async def test_a_deactivation_made_without_signals_is_found_by_the_periodic_check(
    user_factory: Any, experiment_factory: Any, settings: Any
):
    settings.TRAINYARD_SOCKET_RECHECK_SECONDS = 0.2
    alice = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=alice)
    socket = await socket_open(run.pk, cookie_of(await sync_to_async(logged_in)(alice)))
    model = type(alice)
    await sync_to_async(model.objects.filter(pk=alice.pk).update)(is_active=False)
    assert await closed_with(socket) == SocketClose.UNAUTHENTICATED


# ---- token expiry: made with one, shown, refused past it ----


@pytest.mark.django_db
def test_tokens_made_with_an_expiry_on_the_page_and_through_the_api(user_factory: Any) -> None:
    user_factory(username="dave")
    made = Client().post(
        "/api/tokens/",
        {"username": "dave", "password": "pw-dave", "expires_in_days": 30},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    expires_at = made.json()["expires_at"]
    token = ApiToken.objects.get(pk=made.json()["id"])
    assert token.expires_at is not None and token.expires_at.isoformat() == expires_at
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)
    for wrong in (0, 3651, "30", True, 1.5):
        body = {"username": "dave", "password": "pw-dave", "expires_in_days": wrong}
        answer = Client().post("/api/tokens/", body, content_type="application/json")
        assert answer.status_code == 400 and "expires_in_days" in answer.json()["errors"], wrong
    no_expiry = Client().post(
        "/api/tokens/", {"username": "dave", "password": "pw-dave"}, content_type="application/json"
    )
    assert no_expiry.json()["expires_at"] is None

    page = logged_in(token.user)
    page.post("/accounts/tokens/", {"name": "short-lived-x9", "expires_in_days": "7"})
    short = ApiToken.objects.get(name="short-lived-x9")
    assert short.expires_at is not None
    listing = page.get("/accounts/tokens/").content.decode()
    assert short.expires_at.strftime("%Y-%m-%d %H:%M") in listing
    ApiToken.objects.filter(pk=short.pk).update(expires_at=timezone.now() - timedelta(days=1))
    assert "expired" in page.get("/accounts/tokens/").content.decode()
