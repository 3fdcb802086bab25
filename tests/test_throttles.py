"""Throttles (issue 35 item 3): password guessing on the login page, the admin's login and
POST /api/tokens/ is refused with 429 and Retry-After past the failures allowed per account and
per address, leaving other accounts and addresses alone; imports past the hourly limit too."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from dashboard.experiments.core import bounded
from dashboard.models import RateEvent

pytestmark = pytest.mark.django_db

ATTACKER = "198.51.100.7"
ELSEWHERE = "203.0.113.9"
WINDOW = 15 * 60


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = 5
    settings.TRAINYARD_LOGIN_FAILURES_PER_ADDRESS = 20
    settings.TRAINYARD_LOGIN_WINDOW_SECONDS = WINDOW


def page_login(username: str, password: str, address: str, path: str = "/accounts/login/") -> Any:
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


def admin_login(username: str, password: str, address: str) -> Any:
    return page_login(username, password, address, path="/admin/login/?next=/admin/")


def token_login(username: str, password: str, address: str) -> Any:
    body = json.dumps({"username": username, "password": password})
    return Client(REMOTE_ADDR=address).post("/api/tokens/", body, content_type="application/json")


def retry_after(response: Any) -> int:
    seconds = int(response["Retry-After"])
    assert 0 < seconds <= WINDOW
    return seconds


LOGINS = {
    # way in: (its call, what a right password answers, what a wrong one answers)
    "page": (page_login, 302, 200),
    "admin": (admin_login, 302, 200),
    "api": (token_login, 201, 401),
}


@pytest.mark.parametrize("way", list(LOGINS))
def test_a_burst_of_wrong_passwords_is_throttled_for_that_account(
    way: str, user_factory: Any
) -> None:
    login, right, wrong = LOGINS[way]
    alice = user_factory(username="alice", staff=True)
    user_factory(username="bob", staff=True)
    for _ in range(5):
        assert login("alice", "guess", ATTACKER).status_code == wrong
    # The sixth try is not checked, not even with the right password, from anywhere.
    for address in (ATTACKER, ELSEWHERE):
        refused = login("alice", "pw-alice", address)
        assert refused.status_code == 429
        retry_after(refused)
    # Another account from another address is not affected.
    assert login("bob", "pw-bob", ELSEWHERE).status_code == right
    text = refused.content.decode()
    if way == "api":
        body = refused.json()
        assert body["limit"] == "login-account" and body["retry_after"] > 0
        assert "Too many failed logins for this account: 5" in body["error"]
    else:
        assert refused["Content-Type"].startswith("text/html")
        assert "Too many failed logins for this account: 5 in the last 15 minutes" in text
    # Once the failures are older than the window, the right password works again.
    RateEvent.objects.update(at=RateEvent.objects.first().at - timedelta(seconds=WINDOW))
    assert login("alice", "pw-alice", ATTACKER).status_code == right
    assert alice.is_active


@pytest.mark.parametrize("way", list(LOGINS))
def test_one_address_guessing_many_accounts_is_throttled(way: str, user_factory: Any) -> None:
    login, right, wrong = LOGINS[way]
    user_factory(username="carol", staff=True)
    for n in range(20):  # one wrong password for each of 20 names
        assert login(f"user{n}", "guess", ATTACKER).status_code == wrong
    refused = login("carol", "pw-carol", ATTACKER)
    assert refused.status_code == 429 and retry_after(refused)
    assert "from your address" in refused.content.decode()
    # Carol from her own address logs in.
    assert login("carol", "pw-carol", ELSEWHERE).status_code == right


def test_logins_that_succeed_count_for_nothing(user_factory: Any) -> None:
    user_factory(username="dora")
    for _ in range(4):
        assert page_login("dora", "typo", ATTACKER).status_code == 200
    for _ in range(10):
        assert page_login("dora", "pw-dora", ATTACKER).status_code == 302
    assert page_login("dora", "pw-dora", ATTACKER).status_code == 302
    assert RateEvent.objects.filter(kind="login-account").count() == 4


def test_the_account_is_counted_as_the_login_form_reads_its_name(user_factory: Any) -> None:
    user_factory(username="erin")
    for name in ("erin", "ERIN", "Erin", "eRin", "ｅｒｉｎ"):  # the last in full-width letters
        page_login(name, "guess", ATTACKER)
    assert page_login("erin", "pw-erin", ELSEWHERE).status_code == 429


def test_an_ipv6_client_is_counted_by_its_network(user_factory: Any, settings: Any) -> None:
    settings.TRAINYARD_LOGIN_FAILURES_PER_ADDRESS = 3
    user_factory(username="fay")
    for host in (1, 2, 3):
        page_login(f"name{host}", "guess", f"2001:db8:1:2::{host}")
    assert page_login("fay", "pw-fay", "2001:db8:1:2:ffff::1").status_code == 429
    assert page_login("fay", "pw-fay", "2001:db8:1:3::1").status_code == 302


def test_zero_turns_the_limits_off(user_factory: Any, settings: Any) -> None:
    settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = 0
    settings.TRAINYARD_LOGIN_FAILURES_PER_ADDRESS = 0
    user_factory(username="gus")
    for _ in range(8):
        page_login("gus", "guess", ATTACKER)
    assert page_login("gus", "pw-gus", ATTACKER).status_code == 302


def password_change(client: Client, old: str) -> Any:
    change = {
        "old_password": old,
        "new_password1": "a-new-Pass-42",
        "new_password2": "a-new-Pass-42",
    }
    return client.post("/accounts/password_change/", change)


def test_the_password_change_page_is_no_way_around_the_limit(user_factory: Any) -> None:
    # Its old password is checked by the form (check_password), not authenticate(): whoever
    # held a session (a browser left open, a stolen cookie) could guess the password there
    # without limit, then keep the account after the session ended.
    user = user_factory(username="ivy")
    held = Client(REMOTE_ADDR=ATTACKER)
    held.force_login(user)
    for _ in range(5):
        wrong = password_change(held, "guess")
        assert wrong.status_code == 200 and "old_password" in wrong.context["form"].errors
    refused = password_change(held, "pw-ivy")  # the right one is not checked
    assert refused.status_code == 429 and retry_after(refused)
    assert "Too many failed logins for this account" in refused.content.decode()
    user.refresh_from_db()
    assert user.check_password("pw-ivy")
    # The failures are the account's: its login page is throttled too, from anywhere.
    assert page_login("ivy", "pw-ivy", ELSEWHERE).status_code == 429
    # Once they are older than the window, the change goes through.
    RateEvent.objects.update(at=RateEvent.objects.first().at - timedelta(seconds=WINDOW))
    assert password_change(held, "pw-ivy").status_code == 302


# --- imports per user per hour -----------------------------------------------------------------


def import_csv(client: Client, content: bytes = b"step,loss\n1,0.5\n2,0.25\n") -> Any:
    upload = SimpleUploadedFile("run.csv", content)
    return client.post("/api/experiments/import/", {"file": upload})


def test_imports_past_the_hourly_limit_get_429(user_factory: Any, settings: Any) -> None:
    settings.TRAINYARD_IMPORT_RATE_PER_HOUR = 3
    alice, bob = Client(), Client()
    alice.force_login(user_factory())
    bob.force_login(user_factory())
    assert import_csv(alice).status_code == 201
    assert import_csv(alice, b"not a csv at all").status_code == 400  # a refused one counts
    assert import_csv(alice).status_code == 201
    refused = import_csv(alice)
    assert refused.status_code == 429
    seconds = int(refused["Retry-After"])
    assert 3500 < seconds <= 3600
    body = refused.json()
    assert body["limit"] == "import_rate" and body["retry_after"] == seconds
    assert "TRAINYARD_IMPORT_RATE_PER_HOUR" in body["error"]
    assert import_csv(bob).status_code == 201  # another user's imports are theirs
    # An hour after the first, one more.
    first = RateEvent.objects.filter(kind="import_rate").order_by("at").first()
    assert first is not None
    first.at -= timedelta(hours=1)
    first.save()
    assert import_csv(alice).status_code == 201


def test_an_import_with_no_turn_to_be_read_gets_429(
    user_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Files are read by bounded children, TRAINYARD_IMPORT_CONCURRENCY at once (core/bounded.py).
    monkeypatch.setenv("TRAINYARD_IMPORT_CONCURRENCY", "1")
    monkeypatch.setattr(bounded, "SLOT_WAIT_SECONDS", 0.1)
    client = Client()
    client.force_login(user_factory())
    with bounded._turn(bound=30):  # another import's child, reading
        refused = import_csv(client)
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 30
    body = refused.json()
    assert body["limit"] == "import_readers" and body["retry_after"] == int(refused["Retry-After"])
    assert import_csv(client).status_code == 201  # its turn come


# --- through daphne, with failures counted in other processes -------------------------------------


@pytest.mark.integration
@pytest.mark.sqlite_only  # rows like any other: the in-process tests above run on both engines
@pytest.mark.timeout(300)
def test_the_limit_holds_across_processes_on_the_real_server(stack: Any) -> None:
    import requests

    stack.user_create("hana")
    login_page = f"{stack.base_url}/accounts/login/"
    for _ in range(3):  # three wrong passwords on daphne's login page
        session = requests.Session()
        session.get(login_page, timeout=10)
        form = {"username": "hana", "password": "guess", "csrfmiddlewaretoken": ""}
        form["csrfmiddlewaretoken"] = session.cookies["csrftoken"]  # set by the GET
        page = session.post(login_page, data=form, headers={"Referer": login_page}, timeout=10)
        assert page.status_code == 200
    # Two more in another process altogether (a script calling authenticate()).
    code = (
        "from django.contrib.auth import authenticate as a;"
        "[a(username='hana', password='guess') for _ in range(2)]"
    )
    stack.manage("shell", "-c", code)
    right = {"username": "hana", "password": stack.passwords["hana"]}
    refused = requests.post(f"{stack.base_url}/api/tokens/", json=right, timeout=10)
    assert refused.status_code == 429 and 0 < int(refused.headers["Retry-After"]) <= 900
    assert refused.json()["limit"] == "login-account"
    session = requests.Session()
    session.get(login_page, timeout=10)
    form = {**right, "csrfmiddlewaretoken": session.cookies["csrftoken"]}
    page = session.post(login_page, data=form, headers={"Referer": login_page}, timeout=10)
    assert page.status_code == 429 and "Retry-After" in page.headers
    assert "Too many failed logins for this account" in page.text
    assert stack.login("alice")  # another account is not affected
