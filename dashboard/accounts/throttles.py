"""Password guessing, throttled: failed logins are counted per username tried and per client
address over a sliding window (TRAINYARD_LOGIN_*), and a login past either limit is refused
with 429 and Retry-After before its password is checked.

Every way in goes through django.contrib.auth.authenticate(): the login page, the admin's and
POST /api/tokens/ (the password change page checks its old password itself, through
password_check_throttled). So the check is an authentication backend, LoginThrottle, first in
AUTHENTICATION_BACKENDS: it authenticates no one, and raises LoginThrottled past a limit, which
authenticate() lets through (it stops only on PermissionDenied). The form logins' 429 page is
LoginThrottledPage's, the API's answer the token route's own. A failure is counted where
authenticate() says so (its user_login_failed signal, connected in AccountsConfig.ready), so a
login that succeeds counts for nothing.

The failures are rows (dashboard.models.RateEvent), so the limits hold across every web server
process and machine. The check and the count are not one transaction: logins checked at the
same moment in several processes may each get their try before the others' failures are
counted, at most one extra try per process (daphne runs a process's views one at a time).
"""

from __future__ import annotations

import ipaddress
import unicodedata
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard.rates import rate_event_record, rate_events_recent, rate_retry_after

FAILED_FOR_ACCOUNT = "login-account"
FAILED_FROM_ADDRESS = "login-address"
# One person's IPv6 network is a /64 at least: its addresses are one address to the limit.
IPV6_PREFIX = 64


class LoginThrottled(Exception):
    """Too many failed logins for the account tried or from the client's address: the 429."""

    def __init__(self, *, limit: str, failures: int, most: int, retry_after: int) -> None:
        self.limit = limit
        self.retry_after = retry_after
        whose = "for this account" if limit == FAILED_FOR_ACCOUNT else "from your address"
        self.message = (
            f"Too many failed logins {whose}: {failures} in the last "
            f"{_minutes(settings.TRAINYARD_LOGIN_WINDOW_SECONDS)}, the most allowed is {most}. "
            f"Try again in {_minutes(retry_after)}."
        )
        super().__init__(self.message)

    def as_details(self) -> dict[str, Any]:
        return {"limit": self.limit, "retry_after": self.retry_after}


def _minutes(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} s"
    minutes = -(-seconds // 60)
    return f"{minutes} minute{'' if minutes == 1 else 's'}"


def login_account_key(username: str) -> str:
    """The username as the limit counts it: the login form's normalisation (NFKC), and case
    folded, so that "Alice" and "ALICE" are one account to it on any database's collation."""
    return unicodedata.normalize("NFKC", username).casefold()[:150]


def login_address_key(request: HttpRequest | None) -> str | None:
    """The client's address as the limit counts it (an IPv6 one by its /64), or None where
    there is no request. Behind a proxy, daphne's --proxy-headers makes it the client's."""
    raw = request.META.get("REMOTE_ADDR") if request is not None else None
    if not raw:
        return None
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return str(raw)[:150]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # ::ffff:a.b.c.d is a.b.c.d
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/{IPV6_PREFIX}", strict=False))
    return str(address)


def _limits(username: str, request: HttpRequest | None) -> list[tuple[str, str, int]]:
    """(kind, key, most) of each limit that applies to this login."""
    limits = [(FAILED_FOR_ACCOUNT, login_account_key(username), _most(FAILED_FOR_ACCOUNT))]
    address = login_address_key(request)
    if address is not None:
        limits.append((FAILED_FROM_ADDRESS, address, _most(FAILED_FROM_ADDRESS)))
    return limits


def _most(kind: str) -> int:
    if kind == FAILED_FOR_ACCOUNT:
        return int(settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT)
    return int(settings.TRAINYARD_LOGIN_FAILURES_PER_ADDRESS)


def _window() -> timedelta:
    return timedelta(seconds=settings.TRAINYARD_LOGIN_WINDOW_SECONDS)


def login_throttle_check(
    *, username: str, request: HttpRequest | None, now: datetime
) -> LoginThrottled | None:
    """The refusal of a login of `username` from the request's client now, or None."""
    refusals = []
    for kind, key, most in _limits(username, request):
        if most <= 0:  # 0 turns the limit off
            continue
        times = rate_events_recent(kind=kind, key=key, now=now, window=_window())
        retry_after = rate_retry_after(times=times, most=most, now=now, window=_window())
        if retry_after is not None:
            refusals.append(
                LoginThrottled(limit=kind, failures=len(times), most=most, retry_after=retry_after)
            )
    # Past both: the answer waits for the later of the two.
    return max(refusals, key=lambda refused: refused.retry_after, default=None)


def login_failure_record(
    sender: Any, *, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    """The receiver of user_login_failed: one failure for the account tried and one for the
    address it came from."""
    username = credentials.get("username")
    if not isinstance(username, str) or not username:
        return
    now = timezone.now()
    for kind, key, _ in _limits(username, request):
        rate_event_record(kind=kind, keys=[key], now=now, window=_window())


def password_check_throttled(*, user: Any, password: str, request: HttpRequest | None) -> bool:
    """user.check_password(password) under the same limits, for a form that checks a password
    itself rather than through authenticate() (the password change's old password, which
    whoever holds a session could otherwise guess without limit): past a limit LoginThrottled,
    the password unchecked; a wrong one counted as authenticate() counts its failures."""
    username = user.get_username()
    refused = login_throttle_check(username=username, request=request, now=timezone.now())
    if refused is not None:
        raise refused
    if user.check_password(password):
        return True
    user_login_failed.send(sender=__name__, credentials={"username": username}, request=request)
    return False


class LoginThrottle:
    """An authentication backend that lets no one in: past a limit it raises LoginThrottled
    before the next backend checks the password; otherwise it passes (None). No get_user: a
    session never names it."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> AbstractBaseUser | None:
        if username:
            refused = login_throttle_check(username=username, request=request, now=timezone.now())
            if refused is not None:
                raise refused
        return None


def login_throttled_answer(request: HttpRequest, refused: LoginThrottled) -> HttpResponse:
    """The form logins' 429: a page that says why and when to try again."""
    page = render(
        request, "registration/login_throttled.html", {"message": refused.message}, status=429
    )
    page["Retry-After"] = str(refused.retry_after)
    return page


class LoginThrottledPage:
    """Middleware: a view that raised LoginThrottled (the login page's form, the admin's)
    answers with the 429 page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, LoginThrottled):
            return login_throttled_answer(request, exception)
        return None
