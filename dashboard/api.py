"""Plumbing shared by the JSON API views: authentication, CSRF, JSON bodies and errors."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from dashboard.accounts.services import token_authenticate

# The same figure as settings.DATA_UPLOAD_MAX_MEMORY_SIZE (tests/test_fuzz.py checks), so that
# Django's own check and this one refuse the same bodies.
MAX_BODY_BYTES = 64 * 1024

View = Callable[..., HttpResponse]


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        errors: dict[str, list[str]] | None = None,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or {}
        # Extra keys of the JSON answer (a 429's limit and retry_after) and HTTP headers.
        self.details = details or {}
        self.headers = headers or {}


def error_response(
    status: int,
    message: str,
    errors: dict[str, list[str]] | None = None,
    *,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JsonResponse:
    body: dict[str, Any] = {"error": message, **(details or {})}
    if errors:
        body["errors"] = errors
    return JsonResponse(body, status=status, headers=headers)


def _authenticate_token(request: HttpRequest) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() not in {"bearer", "token"} or not key.strip():
        return False
    token = token_authenticate(key=key)
    if token is None:
        # Unknown, revoked, or its user deactivated: one answer, so a caller learns nothing.
        raise ApiError(401, "invalid or revoked API token")
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
            try:
                # Login first: an anonymous caller learns nothing, not even which methods a
                # path takes.
                by_token = _authenticate_token(request)
                if not by_token and not request.user.is_authenticated:
                    return error_response(401, "login or an API token is required")
                if request.method not in methods:
                    return error_response(
                        405,
                        f"method {request.method} not allowed; use {', '.join(methods)}",
                        headers={"Allow": ", ".join(methods)},
                    )
                writes = request.method not in {"GET", "HEAD", "OPTIONS"}
                if not by_token and writes and _csrf_failure(request) is not None:
                    return error_response(403, "CSRF token missing or incorrect")
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(
                    exc.status, exc.message, exc.errors, details=exc.details, headers=exc.headers
                )
            except RequestDataTooBig:
                # Django refuses the body (Content-Length over DATA_UPLOAD_MAX_MEMORY_SIZE) when
                # the CSRF check or the view first reads it: a JSON 413, not an HTML 400.
                return error_response(413, f"request body over {MAX_BODY_BYTES} bytes")

        return wrapper

    return decorate


def json_constant_refuse(name: str) -> Any:
    # Python's json reads NaN, Infinity and -Infinity, which JSON itself does not have.
    raise ValueError(f"{name} is not a JSON number")


def json_float_parse(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as inf
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def json_body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = request.body
    except RequestDataTooBig:
        raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes") from None
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes")
    if not body:
        return {}
    try:
        data = json.loads(body, parse_constant=json_constant_refuse, parse_float=json_float_parse)
    except (ValueError, UnicodeDecodeError) as exc:
        # ValueError covers integers over Python's 4,300-digit limit too.
        raise ApiError(400, f"body is not valid JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise ApiError(400, "body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object")
    return data
