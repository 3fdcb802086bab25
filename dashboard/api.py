"""Plumbing shared by the JSON API views: authentication, CSRF, JSON bodies and errors."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from dashboard.accounts.models import ApiToken

MAX_BODY_BYTES = 64 * 1024

View = Callable[..., HttpResponse]


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or {}


def error_response(status: int, message: str, errors: dict[str, list[str]] | None = None):
    body: dict[str, Any] = {"error": message}
    if errors:
        body["errors"] = errors
    return JsonResponse(body, status=status)


def _authenticate_token(request: HttpRequest) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() not in {"bearer", "token"} or not key.strip():
        return False
    token = ApiToken.objects.select_related("user").filter(key=key.strip()).first()
    if token is None or not token.user.is_active:
        raise ApiError(401, "invalid API token")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    request.user = token.user
    return True


def _csrf_failure(request: HttpRequest) -> HttpResponse | None:
    # Session-authenticated writes need the CSRF token, exactly as a form post would.
    check = CsrfViewMiddleware(lambda req: HttpResponse())
    check.process_request(request)
    return check.process_view(request, lambda req: HttpResponse(), (), {})


def api_view(methods: tuple[str, ...]) -> Callable[[View], View]:
    """Token or session login, CSRF for session writes, JSON errors for everything that fails."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        @csrf_exempt
        @login_not_required
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                return error_response(405, f"method {request.method} not allowed; use {methods}")
            try:
                by_token = _authenticate_token(request)
                if not by_token:
                    if not request.user.is_authenticated:
                        return error_response(401, "login or an API token is required")
                    if request.method not in {"GET", "HEAD", "OPTIONS"}:
                        failure = _csrf_failure(request)
                        if failure is not None:
                            return error_response(403, "CSRF token missing or incorrect")
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status, exc.message, exc.errors)

        return wrapper

    return decorate


def json_body(request: HttpRequest) -> dict[str, Any]:
    if len(request.body) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes")
    if not request.body:
        return {}
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object")
    return data
