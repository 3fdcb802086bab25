"""Text no database column can store: a NUL character (PostgreSQL refuses it in any text value,
as psycopg's "A string literal cannot contain NUL (0x00) characters") and a lone UTF-16
surrogate (which no UTF-8 codec encodes, so SQLite and PostgreSQL both fail on it). Django's form
fields refuse NUL themselves (ProhibitNullCharactersValidator); what reaches a query or a
column another way (query parameters, JSON bodies, multipart fields) is checked here, so that it
is a 400 naming the field rather than a 500 from the database driver.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

_SURROGATE = re.compile("[\ud800-\udfff]")


def text_fault(text: str) -> str:
    """Why the text cannot be stored, or "" when it can."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored"
    if _SURROGATE.search(text):
        return "contains an unpaired UTF-16 surrogate, which is not text"
    return ""


def texts_of(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a decoded JSON value, keys included, with the field it sits under (the
    top-level key: that is how the API's errors name fields)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            field = where or str(key)
            yield field, str(key)
            yield from texts_of(item, field)
    elif isinstance(value, list):
        for item in value:
            yield from texts_of(item, where)


def texts_fault(value: Any, where: str = "") -> dict[str, list[str]]:
    """The first unstorable string of a JSON value or a QueryDict's items, as {field: [why]}."""
    for field, text in texts_of(value, where):
        why = text_fault(text)
        if why:
            return {field or "body": [why]}
    return {}


def query_text_guard(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[..., Any]:
    """Middleware: a query parameter (name or value) that cannot be stored is a 400 before any
    view filters the database with it (the run list's q, tag, name, ...); under /api/ in the
    API's error shape (dashboard.api.error_response, not imported: that module imports this)."""

    def middleware(request: HttpRequest) -> HttpResponse:
        refused = texts_fault({key: request.GET.getlist(key) for key in request.GET})
        if not refused:
            return get_response(request)
        field, (why,) = next(iter(refused.items()))
        message = f"query parameter {field[:40]!r} {why}"
        if request.path == "/api" or request.path.startswith("/api/"):
            return JsonResponse({"error": message, "errors": refused}, status=400)
        return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")

    return middleware
