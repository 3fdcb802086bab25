"""Access control: the login wall on every URL, ownership, CSRF, WebSocket origin and login,
per-user launch limits, and the production settings (`check --deploy`)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.services import experiment_launch
from tests.factories import form_data

ROOT = Path(__file__).resolve().parent.parent
ORIGIN = (b"origin", b"http://localhost")
# Pages anyone may open: the two login forms.
PUBLIC_ROUTES = {"accounts/login/", "admin/login/"}
# Sample paths for the admin's two regular-expression routes.
REGEX_SAMPLES = {
    r"admin/^(?P<app_label>auth|accounts|experiments|devices|studies)/$": "admin/experiments/",
    r"admin/(?P<url>.*)$": "admin/no-such-page/",
}
MISSING_PK = 987_654_321
VALID_FORM = form_data()


def client_for(user: Any = None, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    if user is not None:
        client.force_login(user)
    return client


def routes_walk(patterns: list[Any], prefix: str = "") -> Iterator[str]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from routes_walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern)


def route_path(route: str, *, values: dict[str, Any]) -> str:
    """A concrete path for a route; a new kind of parameter fails here until given a sample."""
    if route in REGEX_SAMPLES:
        return "/" + REGEX_SAMPLES[route]
    assert "(?P<" not in route, f"add a sample path for the regex route {route!r}"

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in values, f"add a sample value for <{name}> (route {route!r})"
        return str(values[name])

    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", value, route)


def all_routes() -> list[str]:
    return sorted(set(routes_walk(get_resolver().url_patterns)))


def sample_values(*, run: Experiment, pk: int) -> dict[str, Any]:
    content_type = ContentType.objects.get_for_model(Experiment)
    return {
        "pk": pk,
        "object_id": pk,
        "id": run.owner_id,
        "content_type_id": content_type.pk,
        "epoch": 1,
        "step": 1,
        "profile_id": 1,
        "rank": 0,
        "token": "not-a-signed-token",
    }


def is_login_redirect(response: Any) -> bool:
    location = response.get("Location", "")
    return response.status_code == 302 and location.startswith(
        ("/accounts/login/", "/admin/login/")
    )


# --- the login wall: every URL ------------------------------------------------------------------


@pytest.mark.django_db
def test_every_url_needs_login(user_factory: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=user_factory())
    values = sample_values(run=run, pk=run.pk)
    anonymous = client_for()
    checked = 0
    for route in all_routes():
        path = route_path(route, values=values)
        for method in ("get", "post"):
            response = getattr(anonymous, method)(path)
            where = f"anonymous {method.upper()} {path}"
            if route in PUBLIC_ROUTES:
                assert response.status_code == 200, where
            elif route.startswith("api/"):
                assert response.status_code == 401, where
                assert "login" in response.json()["error"], where
            else:
                assert is_login_redirect(response), f"{where}: {response.status_code}"
            checked += 1
    assert checked >= 2 * 40, "the walk should cover the admin, the pages and the API"


@pytest.mark.django_db
def test_the_password_reset_pages_are_gone() -> None:
    # They would answer anonymous visitors and try to send mail, which Trainyard has no setup for.
    assert not [route for route in all_routes() if "reset" in route]
    assert Client().get("/accounts/password_reset/").status_code in {302, 404}


# --- ownership: other users get 404, staff see everything -------------------------------------


def object_routes() -> list[str]:
    return [
        route for route in all_routes() if "<int:pk>" in route and not route.startswith("admin/")
    ]


@pytest.mark.django_db
def test_other_users_get_404_and_staff_what_the_owner_gets(
    user_factory: Any, experiment_factory: Any
) -> None:
    owner, stranger, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = experiment_factory(owner=owner, status=Status.SUCCEEDED)
    present, missing = sample_values(run=run, pk=run.pk), sample_values(run=run, pk=MISSING_PK)
    as_owner, as_stranger, as_staff = client_for(owner), client_for(stranger), client_for(staff)
    routes = object_routes()
    assert len(routes) >= 5, routes
    for route in routes:
        path, nowhere = route_path(route, values=present), route_path(route, values=missing)
        for method in ("get", "post"):
            seen = getattr(as_stranger, method)(path).status_code
            # A stranger learns nothing: the same answer as for a run that does not exist.
            assert seen == getattr(as_stranger, method)(nowhere).status_code, (method, path)
            assert seen in {404, 405}, (method, path, seen)
        owner_status = as_owner.get(path).status_code
        assert as_staff.get(path).status_code == owner_status, path


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/experiments/{pk}/",
        "/api/experiments/{pk}/",
        "/api/experiments/{pk}/metrics/",
        "/api/experiments/{pk}/logs/",
        "/api/experiments/{pk}/logs/?rank=1&format=text",
    ],
)
def test_run_pages_for_owner_stranger_and_staff(
    user_factory: Any, experiment_factory: Any, path: str
) -> None:
    owner, stranger, staff = user_factory(), user_factory(), user_factory(staff=True)
    url = path.format(pk=experiment_factory(owner=owner).pk)
    assert client_for(owner).get(url).status_code == 200
    assert client_for(stranger).get(url).status_code == 404
    assert client_for(staff).get(url).status_code == 200


@pytest.mark.django_db
def test_lists_show_own_runs_and_staff_all(user_factory: Any, experiment_factory: Any) -> None:
    alice, bob, staff = user_factory(), user_factory(), user_factory(staff=True)
    mine = experiment_factory(owner=alice, name="alice-run")
    theirs = experiment_factory(owner=bob, name="bob-run")

    def ids(user: Any) -> set[int]:
        return {e["id"] for e in client_for(user).get("/api/experiments/").json()["experiments"]}

    assert ids(alice) == {mine.pk} and ids(bob) == {theirs.pk}
    assert ids(staff) == {mine.pk, theirs.pk}
    page = client_for(alice).get("/").content.decode()
    assert "alice-run" in page and "bob-run" not in page
    # A clone is a read of the source: a stranger's run cannot be copied.
    assert client_for(alice).get(f"/experiments/new/?clone={theirs.pk}").status_code == 404


@pytest.mark.django_db
def test_only_owner_and_staff_change_tags_and_note(
    user_factory: Any, experiment_factory: Any
) -> None:
    owner, stranger, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = experiment_factory(owner=owner)

    def patch(user: Any, note: str) -> int:
        body = json.dumps({"note": note})
        url = f"/api/experiments/{run.pk}/"
        return client_for(user).patch(url, body, content_type="application/json").status_code

    assert patch(stranger, "theirs") == 404
    assert patch(owner, "mine") == 200 and patch(staff, "staff's") == 200
    run.refresh_from_db()
    assert run.note == "staff's"
    tokenless = client_for(owner, csrf=True)
    body = json.dumps({"note": "forged"})
    response = tokenless.patch(f"/api/experiments/{run.pk}/", body, content_type="application/json")
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.note == "staff's"


@pytest.mark.django_db
def test_only_owner_and_staff_stop(user_factory: Any, experiment_factory: Any) -> None:
    owner, stranger, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = experiment_factory(owner=owner)
    assert client_for(stranger).post(f"/api/experiments/{run.pk}/stop/").status_code == 404
    run.refresh_from_db()
    assert run.status == Status.QUEUED
    assert client_for(staff).post(f"/api/experiments/{run.pk}/stop/").status_code == 202
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.cancelled_by == staff


@pytest.mark.django_db
def test_admin_is_for_staff_only(user_factory: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=user_factory())
    admin_user = user_factory(staff=True, is_superuser=True)
    for path in ("/admin/", f"/admin/experiments/experiment/{run.pk}/change/"):
        assert is_login_redirect(client_for(user_factory()).get(path)), path
        assert client_for(admin_user).get(path).status_code == 200, path


# --- CSRF ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_session_posts_need_the_csrf_token(
    user_factory: Any, experiment_factory: Any, launched: list[int]
) -> None:
    owner = user_factory()
    run = experiment_factory(owner=owner)
    client = client_for(owner, csrf=True)
    for path, body in (
        ("/api/experiments/", "{}"),
        (f"/api/experiments/{run.pk}/stop/", ""),
        (f"/api/experiments/{run.pk}/checkpoint/", ""),
        (f"/api/experiments/{run.pk}/profile/", '{"steps": 5}'),
    ):
        response = client.post(path, body, content_type="application/json")
        assert response.status_code == 403 and "CSRF" in response.json()["error"], path
    assert client.post("/experiments/new/", VALID_FORM).status_code == 403
    assert client.post("/accounts/logout/").status_code == 403
    assert Experiment.objects.count() == 1 and not launched
    run.refresh_from_db()
    assert run.status == Status.QUEUED


@pytest.mark.django_db
def test_session_posts_with_the_token_pass(
    user_factory: Any, launched: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    client = client_for(user_factory(), csrf=True)
    assert client.get("/experiments/new/").status_code == 200  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    with django_capture_on_commit_callbacks(execute=True):
        form = client.post("/experiments/new/", {**VALID_FORM, "csrfmiddlewaretoken": token})
        api = client.post(
            "/api/experiments/",
            json.dumps({"strategy": "single"}),
            content_type="application/json",
            HTTP_X_CSRFTOKEN=token,
        )
    assert form.status_code == 302 and api.status_code == 201, api.content
    assert len(launched) == 2


@pytest.mark.django_db
def test_admin_actions_need_the_csrf_token(user_factory: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=user_factory())
    client = client_for(user_factory(staff=True, is_superuser=True), csrf=True)
    response = client.post(
        "/admin/experiments/experiment/",
        {"action": "stop_runs", "_selected_action": [run.pk]},
    )
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == Status.QUEUED


@pytest.mark.django_db
def test_every_post_form_carries_the_csrf_token(user_factory: Any, experiment_factory: Any) -> None:
    owner = user_factory()
    run = experiment_factory(owner=owner, status=Status.RUNNING)
    values = sample_values(run=run, pk=run.pk)
    client = client_for(owner)
    pages = 0
    for route in all_routes():
        if route.startswith(("admin/", "api/")):
            continue  # the admin is Django's own; the API has no forms
        path = route_path(route, values=values)
        response = client.get(path)
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        pages += 1
        html = response.content.decode()
        for form in re.findall(r"<form\b[^>]*>.*?</form>", html, flags=re.S | re.I):
            if re.search(r"method=[\"']?post", form, flags=re.I):
                assert 'name="csrfmiddlewaretoken"' in form, (path, form[:200])
    assert pages >= 5


# --- WebSocket: origin and login -------------------------------------------------------------


def ws_application() -> Any:
    from dashboard.asgi import application

    return application


async def ws_connects(pk: int, *, headers: list[tuple[bytes, bytes]]) -> bool:
    comm = WebsocketCommunicator(ws_application(), f"/ws/experiments/{pk}/", headers=headers)
    connected, _ = await comm.connect()
    if connected:
        assert (await comm.receive_json_from())["type"] == "snapshot"
    await comm.disconnect()
    return bool(connected)


def session_cookie(user: Any) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


@pytest.mark.django_db(transaction=True)
async def test_websocket_needs_a_session_and_our_origin(
    user_factory: Any, experiment_factory: Any
) -> None:
    owner = await sync_to_async(user_factory)()
    stranger = await sync_to_async(user_factory)()
    staff = await sync_to_async(user_factory)(staff=True)
    run = await sync_to_async(experiment_factory)(owner=owner)
    owner_cookie = await sync_to_async(session_cookie)(owner)
    # The real AuthMiddlewareStack: the user comes from the session cookie.
    assert await ws_connects(run.pk, headers=[ORIGIN, owner_cookie])
    assert not await ws_connects(run.pk, headers=[ORIGIN])
    assert not await ws_connects(run.pk, headers=[ORIGIN, (b"cookie", b"sessionid=forged")])
    assert not await ws_connects(
        run.pk, headers=[ORIGIN, await sync_to_async(session_cookie)(stranger)]
    )
    assert await ws_connects(run.pk, headers=[ORIGIN, await sync_to_async(session_cookie)(staff)])
    # Origin: another site's page, or none at all, is refused even with a valid session.
    assert not await ws_connects(
        run.pk, headers=[(b"origin", b"http://evil.example"), owner_cookie]
    )
    assert not await ws_connects(run.pk, headers=[owner_cookie])
    assert not await ws_connects(MISSING_PK, headers=[ORIGIN, owner_cookie])


# --- per-user limits -------------------------------------------------------------------------


def api_launch(client: Client) -> Any:
    return client.post(
        "/api/experiments/", json.dumps({"strategy": "single"}), content_type="application/json"
    )


def assert_limited(response: Any, *, limit: str, words: tuple[str, ...]) -> int:
    assert response.status_code == 429, response.content
    body = response.json()
    assert body["limit"] == limit and body["retry_after"] >= 1
    assert int(response["Retry-After"]) == body["retry_after"]
    for word in words:
        assert word in body["error"], (word, body["error"])
    return int(body["retry_after"])


@pytest.mark.django_db
def test_limits_default_to_4_active_and_10_a_minute(settings: Any) -> None:
    for name in ("TRAINYARD_MAX_ACTIVE_RUNS_PER_USER", "TRAINYARD_LAUNCH_RATE_PER_MINUTE"):
        assert name not in os.environ, f"unset {name} to run this test"
    assert settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER == 4
    assert settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE == 10


@pytest.mark.django_db
def test_too_many_active_runs_get_429(
    settings: Any, user_factory: Any, experiment_factory: Any, launched: list[int]
) -> None:
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 2
    alice, bob = user_factory(), user_factory()
    queued = experiment_factory(owner=alice, status=Status.QUEUED)
    experiment_factory(owner=alice, status=Status.RUNNING)
    experiment_factory(owner=alice, status=Status.SUCCEEDED)  # finished runs do not count
    client = client_for(alice)
    response = api_launch(client)
    assert_limited(response, limit="active_runs", words=("2", "queued or running", "retry"))
    # The form says the same, with the same status and header.
    page = client.post("/experiments/new/", VALID_FORM)
    assert page.status_code == 429 and int(page["Retry-After"]) >= 1
    assert "queued or running" in page.content.decode()
    assert Experiment.objects.filter(owner=alice).count() == 3
    # Another user has limits of their own.
    assert api_launch(client_for(bob)).status_code == 201
    # Once a run ends there is room again.
    Experiment.objects.filter(pk=queued.pk).update(status=Status.CANCELLED)
    assert api_launch(client).status_code == 201


@pytest.mark.django_db
def test_too_many_launches_a_minute_get_429(
    settings: Any, user_factory: Any, experiment_factory: Any, launched: list[int]
) -> None:
    settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE = 3
    alice = user_factory()
    runs = [experiment_factory(owner=alice, status=Status.FAILED) for _ in range(3)]
    client = client_for(alice)
    retry = assert_limited(api_launch(client), limit="launch_rate", words=("3", "minute"))
    assert 1 <= retry <= 60
    page = client.post("/experiments/new/", VALID_FORM)
    assert page.status_code == 429 and "in the last minute" in page.content.decode()
    # The oldest launch leaves the window: one more is allowed.
    Experiment.objects.filter(pk=runs[0].pk).update(
        created_at=timezone.now() - timedelta(seconds=61)
    )
    assert api_launch(client).status_code == 201
    assert api_launch(client).status_code == 429


@pytest.mark.django_db(transaction=True)
def test_concurrent_launches_never_pass_the_limit(
    settings: Any, user_factory: Any, launched: list[int]
) -> None:
    # Threads stand in for web server processes: each has its own database connection.
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 3
    alice = user_factory()
    start = threading.Barrier(6)
    outcomes: list[str] = []

    def launch() -> None:
        try:
            start.wait()
            experiment_launch(owner=alice, fields={"name": "race", "strategy": "single"})
            outcomes.append("created")
        except LaunchLimited:
            outcomes.append("limited")
        finally:
            connection.close()

    threads = [threading.Thread(target=launch) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["created"] * 3 + ["limited"] * 3
    assert Experiment.objects.filter(owner=alice).count() == 3


# --- production settings ---------------------------------------------------------------------


PRODUCTION_VARIABLES = frozenset(
    {"TRAINYARD_DEBUG", "DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"}
)


def python_run(*args: str, env: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter with only the given production variables, none of this shell's (nor
    the tests' TRAINYARD_DEBUG=1: tests/settings.py)."""
    clean = {key: value for key, value in os.environ.items() if key not in PRODUCTION_VARIABLES}
    return subprocess.run(  # noqa: S603
        [sys.executable, *args],
        cwd=ROOT,
        env={
            **clean,
            "TRAINYARD_HOME": str(home),
            "DJANGO_SETTINGS_MODULE": "dashboard.settings",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def production_env() -> dict[str, str]:
    # DEBUG is off unless TRAINYARD_DEBUG asks for it: nothing to say here.
    return {"SECRET_KEY": secrets.token_urlsafe(64), "ALLOWED_HOSTS": "example.com"}


def test_check_deploy_is_clean(tmp_path: Path) -> None:
    result = python_run("manage.py", "check", "--deploy", env=production_env(), home=tmp_path)
    print(result.stdout + result.stderr)
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout
    assert "WARNINGS" not in result.stdout + result.stderr


def test_debug_is_off_unless_asked_for(tmp_path: Path) -> None:
    def debug(**env: str) -> str:
        code = "from django.conf import settings; print(settings.DEBUG)"
        result = python_run("-c", code, env=env, home=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip().splitlines()[-1]

    # On main DEBUG was on unless DEBUG=0 said otherwise: a debug 500 page showed the settings.
    assert debug(**production_env()) == "False"
    assert debug(**production_env(), DEBUG="1") == "False"  # a stray variable asks for nothing
    assert debug(TRAINYARD_DEBUG="1") == "True"  # the local dashboard: no key or hosts needed


def recipe_environment() -> dict[str, str]:
    """What the production guide's recipe exports on the web host (docs/guides/production.md:
    its "Every machine" and "The web host" blocks), its placeholders (`<password>`) filled with
    random text."""
    guide = (ROOT / "docs" / "guides" / "production.md").read_text()
    web_host = guide.split("\n## Every machine", 1)[1].split("\n## The workers", 1)[0]
    exports = re.findall(r"^export (\w+)=(\S+)", web_host, flags=re.M)
    assert {"SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"} <= dict(exports).keys()
    return {
        name: re.sub(r"<[^>]*>", lambda _: secrets.token_urlsafe(50), value)
        for name, value in exports
    }


def test_check_deploy_is_clean_for_the_multi_machine_recipe(tmp_path: Path) -> None:
    # On main the recipe set no key and left DEBUG on: W018 (DEBUG), W009 (the key), W004, W008,
    # W012 and W016 (HSTS, the HTTPS redirect and the secure cookies).
    env = recipe_environment()
    result = python_run("manage.py", "check", "--deploy", env=env, home=tmp_path)
    print(result.stdout + result.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS"])
def test_production_refuses_to_start_without(tmp_path: Path, missing: str) -> None:
    env = production_env()
    del env[missing]
    result = python_run("manage.py", "check", env=env, home=tmp_path)
    assert result.returncode != 0 and f"{missing} must be set when DEBUG is off" in result.stderr


def test_production_settings_come_from_the_environment(tmp_path: Path) -> None:
    env = {
        **production_env(),
        "ALLOWED_HOSTS": "example.com,www.example.com",
        "DATABASE_URL": "postgres://trainyard:pw@db.example:5432/trainyard",
        "REDIS_URL": "redis://redis.example:6379/2",
    }
    code = (
        "import json; from django.conf import settings as s; print(json.dumps({"
        "'hosts': s.ALLOWED_HOSTS, 'db': s.DATABASES['default']['HOST'],"
        "'engine': s.DATABASES['default']['ENGINE'], 'broker': s.CELERY_BROKER_URL,"
        "'layer': s.CHANNEL_LAYERS['default']['CONFIG']['hosts'],"
        "'cookies': [s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE],"
        "'ssl': s.SECURE_SSL_REDIRECT, 'hsts': s.SECURE_HSTS_SECONDS, 'debug': s.DEBUG}))"
    )
    # Settings only: loading the apps would need the PostgreSQL driver, which is not installed.
    result = python_run("-c", code, env=env, home=tmp_path)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["hosts"] == ["example.com", "www.example.com"] and facts["debug"] is False
    assert facts["engine"] == "django.db.backends.postgresql" and facts["db"] == "db.example"
    assert facts["broker"] == env["REDIS_URL"] and facts["layer"] == [env["REDIS_URL"]]
    assert facts["cookies"] == [True, True] and facts["ssl"] is True
    assert facts["hsts"] >= 31536000
