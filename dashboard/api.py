"""The JSON API's plumbing on django-ninja: authentication, CSRF, JSON bodies and errors.

Every route under /api/ is an operation of one NinjaAPI (built in dashboard/api_urls.py from
each app's Router), so the OpenAPI document at /api/schema/ lists them all with their auth and
their answers. What ninja does not decide here, on purpose:
- request bodies: a route reads its body with `json_body` and validates it where it always did
  (the launch form), so the schema's body (for the docs) is never a second set of rules;
- the order of refusals: an anonymous caller gets 401 before learning which methods a path
  takes (405), so each path is wrapped in `gate` rather than answered by ninja's 405;
- the error shape: every refusal is `{"error": msg, "errors": {field: [..]}, ...details}`.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import URLPattern, path, reverse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger
from ninja.operation import PathView
from ninja.responses import Response
from ninja.security import APIKeyCookie
from ninja.security.http import HttpAuthBase
from ninja.utils import normalize_path, replace_path_param_notation
from pydantic import ConfigDict

from dashboard.accounts.services import token_authenticate
from dashboard.text_input import texts_fault

# The same figure as settings.DATA_UPLOAD_MAX_MEMORY_SIZE (tests/test_fuzz.py checks), so that
# Django's own check and this one refuse the same bodies.
MAX_BODY_BYTES = 64 * 1024
LOGIN_NEEDED = "login or an API token is required"
BAD_TOKEN = "invalid or revoked API token (or one past its expiry)"


def body_too_big(most: int) -> str:
    """The 413's words, from Django's check, an upload's and the server's (http_server.py)."""
    return f"request body over {most} bytes"


TOO_BIG = body_too_big(MAX_BODY_BYTES)
MAX_ID = 2**63 - 1  # the largest primary key a database column holds
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A body Django cannot parse, or a request it finds suspect (too many fields, ...): the API's 400.
UNREADABLE = (MultiPartParserError, SuspiciousOperation, BadRequest)

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


class ErrorOut(Schema):
    """Every refusal of the API, whatever its status."""

    model_config = ConfigDict(extra="allow")  # details: a 429's limit and retry_after, ...

    error: str
    errors: dict[str, list[str]] | None = None


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


def errors(*statuses: int) -> dict[int, type[Schema]]:
    """The error answers of an operation: these plus 401 (no or a bad login), which all have."""
    return {status: ErrorOut for status in sorted({401, *statuses})}


# ---- authentication: two schemes, as the schema documents them ----


class BearerToken(HttpAuthBase):
    """`Authorization: Bearer <key>` (or `Token <key>`), a key from the tokens page, `POST
    /api/tokens/` or `manage.py create_token`."""

    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> Any:
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() not in {"bearer", "token"} or not key.strip():
            return None
        token = token_authenticate(key=key)
        if token is None:
            # Unknown, revoked, or its user deactivated: one answer, so a caller learns nothing.
            raise ApiError(401, BAD_TOKEN)
        request.user = token.user
        return token


class SessionCookie(APIKeyCookie):
    """The browser's login session; writes need the CSRF token (`X-CSRFToken`), as forms do."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self) -> None:
        # csrf=True tells the docs page to send the token; the check itself is below (only for
        # writes, as a JSON 403), since __call__ is this class's own.
        super().__init__(csrf=True)

    def __call__(self, request: HttpRequest) -> Any:
        return self.authenticate(request, None)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        if not request.user.is_authenticated:
            return None
        if request.method not in SAFE_METHODS and _csrf_failure(request) is not None:
            raise ApiError(403, "CSRF token missing or incorrect")
        return request.user


def _csrf_failure(request: HttpRequest) -> HttpResponse | None:
    check = CsrfViewMiddleware(lambda req: HttpResponse())
    check.process_request(request)
    return check.process_view(request, lambda req: HttpResponse(), (), {})


AUTH = [BearerToken(), SessionCookie()]


def _logged_in(request: HttpRequest) -> bool:
    """For a refusal before any operation runs (a wrong method): raises ApiError for a bad key."""
    return bool(AUTH[0](request)) or request.user.is_authenticated


# ---- JSON bodies ----


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
        raise ApiError(413, TOO_BIG) from None
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, TOO_BIG)
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
    refused = texts_fault(data)
    if refused:
        raise ApiError(400, "body has text that cannot be stored", refused)
    return data


def json_request_body(schema: type[Schema], *, description: str) -> dict[str, Any]:
    """The operation's documented JSON body (openapi_extra). Documentation only: the route
    reads it with json_body and validates it where it always did."""
    content = {"application/json": {"schema": schema.model_json_schema()}}
    return {"requestBody": {"content": content, "description": description, "required": False}}


def query_params(
    *params: tuple[str, dict[str, Any], str], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Documented query parameters (name, JSON schema, description), for openapi_extra. The
    route reads request.GET itself, so that its checks (and their messages) stay the only ones."""
    return {
        "parameters": [
            {
                "in": "query",
                "name": name,
                "required": name in required,
                "schema": schema,
                "description": why,
            }
            for name, schema, why in params
        ]
    }


def file_response(content_type: str, description: str) -> dict[str, Any]:
    """An operation's 200 that is a file or a stream, not JSON (openapi_extra)."""
    body = {"schema": {"type": "string", "format": "binary"}}
    return {"responses": {200: {"description": description, "content": {content_type: body}}}}


def with_upload_handler(factory: Callable[[HttpRequest], Any]) -> Callable[[View], View]:
    """Put an upload handler first, before the CSRF check can read (and so parse) the body."""

    def decorate(view: View) -> View:
        view.upload_handler = factory  # type: ignore[attr-defined]
        return view

    return decorate


# ---- errors in one shape ----


def _validation_failed(request: HttpRequest, exc: Any) -> HttpResponse:
    fields: dict[str, list[str]] = {}
    for problem in exc.errors:
        where = [str(part) for part in problem.get("loc", ()) if part not in {"body", "query"}]
        fields.setdefault(".".join(where) or "request", []).append(str(problem.get("msg")))
    return error_response(400, "invalid request", fields)


def handlers_install(api: NinjaAPI) -> None:
    def http_error(request: HttpRequest, exc: Any) -> HttpResponse:
        return error_response(exc.status_code, str(exc.message))

    api.add_exception_handler(ApiError, lambda r, e: api_error_response(e))
    api.add_exception_handler(HttpError, http_error)
    api.add_exception_handler(ValidationError, _validation_failed)
    api.add_exception_handler(AuthenticationError, lambda r, e: error_response(401, LOGIN_NEEDED))
    api.add_exception_handler(RequestDataTooBig, lambda r, e: error_response(413, TOO_BIG))
    # Raised inside an operation (request.FILES): ninja's own handler for these is its default
    # one, which with DEBUG on answers a text/plain 500 traceback before the gate can catch them.
    for unreadable in UNREADABLE:
        api.add_exception_handler(unreadable, _unreadable)


def api_error_response(exc: Any) -> HttpResponse:
    return error_response(
        exc.status, exc.message, exc.errors, details=exc.details, headers=exc.headers
    )


def _unreadable(request: HttpRequest, exc: Any) -> HttpResponse:
    return error_response(400, f"the request body cannot be read: {str(exc)[:200]}")


def api_answers_json(get_response: View) -> View:
    """Middleware, first in MIDDLEWARE: an error under /api/ that Django answered itself (an
    unknown path's 404, a refused Host's 400, its debug pages) becomes the API's JSON shape,
    the same status and headers, as every operation's own refusals are."""

    def middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        if response.status_code < 400 or not _is_api_path(request.path):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        message = f"no such API path {request.path[:80]}" if response.status_code == 404 else ""
        answer = error_response(response.status_code, message or _reason(response))
        for name, value in response.items():
            if name.lower() not in {"content-type", "content-length"}:
                answer[name] = value
        return answer

    return middleware


def _is_api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def _reason(response: HttpResponse) -> str:
    return str(response.reason_phrase or "error").lower()


# ---- the API object and its URLs ----


def _is_id(value: Any) -> bool:
    """A path's id: ASCII digits within a database integer. The routes take any segment
    (Django's <int:> took any digits, and past the database's integers SQLite raised
    OverflowError on the lookup, a 500), so that a bad one is this JSON 404, not an HTML page."""
    text = str(value)
    return text.isascii() and text.isdigit() and len(text) < 20 and int(text) <= MAX_ID


def gate(view: PathView) -> View:
    """One path's view: the upload cap first, then a wrong method answered after the login
    check (401 first, so an anonymous caller learns nothing), as JSON with Allow."""
    methods = sorted({method for op in view.operations for method in op.methods})
    uploads = [f for op in view.operations if (f := getattr(op.view_func, "upload_handler", None))]
    uploads_most = [most for f in uploads if (most := getattr(f, "body_most", None))]
    answer = view.get_view()

    @csrf_exempt  # session writes are checked by SessionCookie, token writes need none
    @login_not_required  # every operation authenticates itself
    @functools.wraps(answer)
    def gated(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        for factory in uploads:
            request.upload_handlers.insert(0, factory(request))
        try:
            for name, value in kwargs.items():
                if not _is_id(value):
                    if not _logged_in(request):
                        return error_response(401, LOGIN_NEEDED)
                    return error_response(404, f"no such {name} {str(value)[:40]!r}")
            if request.method not in methods:
                if not _logged_in(request):
                    return error_response(401, LOGIN_NEEDED)
                allow = ", ".join(methods)
                message = f"method {request.method} not allowed; use {allow}"
                return error_response(405, message, headers={"Allow": allow})
            return answer(request, *args, **kwargs)
        except ApiError as exc:  # a bad token, met before any operation ran
            return api_error_response(exc)
        except RequestDataTooBig:
            # Django refuses the body (Content-Length over DATA_UPLOAD_MAX_MEMORY_SIZE) when
            # something first reads it: a JSON 413, not an HTML 400.
            return error_response(413, TOO_BIG)
        except UNREADABLE as exc:
            # An unreadable upload, or a request Django finds suspect (too many fields, ...):
            # Django's own answer is its 400 page, not the API's JSON.
            return _unreadable(request, exc)

    gated.api_methods = tuple(methods)
    if uploads_most:
        # The server refuses a larger body before it reads it (dashboard/http_server.py); the
        # limits come from the environment, so they are read for each request.
        gated.body_most = lambda: max(most() for most in uploads_most)
    return gated


def logged_in_only(view: View) -> View:
    """The schema and the docs page: for a token or a session, as every route under /api/."""

    @login_not_required  # answered below as JSON, like the routes, not with a login redirect
    @functools.wraps(view)
    def checked(request: HttpRequest) -> HttpResponse:
        try:
            if not _logged_in(request):
                return error_response(401, LOGIN_NEEDED)
        except ApiError as exc:
            return api_error_response(exc)
        return view(request)

    return checked


class LocalSwagger(Swagger):
    """Swagger UI from ninja's own static files (ninja is in INSTALLED_APPS): no CDN."""

    def get_openapi_url(self, api: NinjaAPI, path_params: dict[str, Any]) -> str:
        return reverse("api-schema")


class TrainyardApi(NinjaAPI):
    def _get_urls(self) -> list[Any]:
        """Plain URL names (api-experiments, ...; no namespace, as before ninja), one pattern a
        path, each behind `gate`; a path's ids are checked there (`_is_id`)."""
        docs, schema = logged_in_only(self._docs_page), logged_in_only(self._schema_json)
        result: list[URLPattern] = [
            path("schema/", schema, name="api-schema"),
            path("docs/", docs, name="api-docs"),
        ]
        for bound in self._get_bound_routers():
            prefix = replace_path_param_notation(bound.prefix)
            for route, view in bound.path_operations.items():
                joined = "/".join(p for p in (prefix, replace_path_param_notation(route)) if p)
                name = view.operations[0].url_name
                result.append(path(normalize_path(joined).lstrip("/"), gate(view), name=name))
        # A segment like <pk> takes any text: literal paths first (experiments/compare/export/
        # before experiments/<pk>/export/), as Django tries them in order.
        return sorted(result, key=lambda pattern: str(pattern.pattern).count("<"))

    def _schema_json(self, request: HttpRequest) -> HttpResponse:
        prefix = reverse("api-schema").removesuffix("schema/")
        return Response(self.get_openapi_schema(path_prefix=prefix))

    def _docs_page(self, request: HttpRequest) -> HttpResponse:
        return self.docs.render_page(request, self)


def api_build(routers: list[Any]) -> TrainyardApi:
    api = TrainyardApi(
        title="Trainyard API",
        version="1",
        description=(
            "Launch, watch, stop and compare training runs. Log in with a token "
            "(`Authorization: Bearer <key>`, from the tokens page or `POST /api/tokens/`) or "
            "the browser's session (writes then need the `X-CSRFToken` header). Every refusal "
            'is JSON: `{"error": message, "errors": {field: [messages]}}`, with details such '
            "as a 429's `limit` and `retry_after`."
        ),
        auth=AUTH,
        docs=LocalSwagger(),
        openapi_url="/schema/",
        docs_url="/docs/",
    )
    handlers_install(api)
    for router in routers:
        api.add_router("", router)
        for view in router.path_operations.values():
            for operation in view.operations:
                summary_from_docstring(operation)
    return api


def summary_from_docstring(operation: Any) -> None:
    """The docs' one-line summary is the view's docstring's first clause (ninja's default is
    the function's name), the whole docstring its description."""
    doc = " ".join((operation.view_func.__doc__ or "").split())
    if doc:
        operation.summary = re.split(r"[.;] ", doc, maxsplit=1)[0].rstrip(".")
        operation.description = doc
