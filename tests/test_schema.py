"""The OpenAPI document at /api/schema/: valid OpenAPI, every route under /api/ in it with its
methods, its auth and its refusals; the docs page served with no CDN."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from openapi_spec_validator import validate

from dashboard.accounts.services import token_create

# The schema and its docs page describe the routes; they are not routes of the API themselves.
META_ROUTES = {"/api/schema/", "/api/docs/"}
# The token exchange's credential is the password in its body: no scheme applies before it.
NO_SCHEME = {("/api/tokens/", "post")}
HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


def routes_walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from routes_walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern


def api_routes() -> dict[str, Any]:
    """Every route under /api/ Django answers, as OpenAPI writes paths (<int:pk> -> {pk})."""
    routes = {}
    for route, pattern in routes_walk(get_resolver().url_patterns):
        if route.startswith("api/"):
            routes["/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)] = pattern
    return routes


@pytest.fixture
def schema(user_factory: Any) -> dict[str, Any]:
    _, key = token_create(user=user_factory(), name="schema")
    response = Client().get("/api/schema/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    return response.json()


@pytest.mark.django_db
def test_schema_is_valid_openapi_3(schema: dict[str, Any]) -> None:
    assert schema["openapi"].startswith("3.")
    validate(schema)  # raises with the first violation of the OpenAPI specification


@pytest.mark.django_db
def test_every_api_route_is_in_the_schema_with_its_methods(schema: dict[str, Any]) -> None:
    routes = api_routes()
    assert set(routes) - META_ROUTES == set(schema["paths"]), (
        "routes under /api/ missing from the schema (or described but not routed)"
    )
    assert len(routes) >= 14
    for path, pattern in routes.items():
        if path in META_ROUTES:
            continue
        documented = {m.upper() for m in schema["paths"][path] if m in HTTP_METHODS}
        # Every API path answers through the gate, which knows the methods it takes.
        assert documented == set(pattern.callback.api_methods), path


@pytest.mark.django_db
def test_every_operation_has_its_auth_and_refusals(schema: dict[str, Any]) -> None:
    schemes = schema["components"]["securitySchemes"]
    assert schemes["BearerToken"] == {"type": "http", "scheme": "bearer"}
    assert schemes["SessionCookie"]["type"] == "apiKey"
    assert schemes["SessionCookie"]["in"] == "cookie"
    error = {"$ref": "#/components/schemas/ErrorOut"}
    operations = 0
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            operations += 1
            where = f"{method.upper()} {path}"
            assert "security" in operation, where
            if (path, method) not in NO_SCHEME:
                assert {"BearerToken": []} in operation["security"], where
                assert {"SessionCookie": []} in operation["security"], where
            refusals = {code: r for code, r in operation["responses"].items() if code[0] == "4"}
            assert "401" in refusals, where
            for code, response in refusals.items():
                assert response["content"]["application/json"]["schema"] in (
                    error,
                    {"$ref": "#/components/schemas/LaunchLimitedOut"},
                ), f"{where} {code}"
            if method != "get":
                assert "403" in refusals or (path, method) in NO_SCHEME, f"{where}: CSRF"
    assert operations >= 15


@pytest.mark.django_db
def test_schema_and_docs_need_a_login_like_the_api() -> None:
    for url in META_ROUTES:
        response = Client().get(url)
        assert response.status_code == 401, url
        assert "login" in response.json()["error"]


@pytest.mark.django_db
def test_docs_page_loads_swagger_from_this_server(client: Client, user_factory: Any) -> None:
    client.force_login(user_factory())
    response = client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets), assets
    assert all(a.startswith("/") for a in assets), f"an asset from elsewhere: {assets}"
    assert "/api/schema/" in html  # where the page reads the schema
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
    # "Try it out" with the session: the page hands Swagger UI the CSRF token for writes.
    assert 'data-api-csrf="true"' in html
    assert re.search(r'data-csrf-token="\w{20,}"', html)
    # Linked from every page's nav.
    assert 'href="/api/docs/"' in client.get("/").content.decode()


@pytest.mark.django_db
def test_what_schemathesis_found_answers_json(user_factory: Any) -> None:
    """Each was a 500 or a non-JSON answer under Schemathesis (tests/test_schemathesis.py)."""
    _, key = token_create(user=user_factory(), name="found")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    huge = "109870196356033171358908153856"
    for path, status in (
        (f"/api/experiments/compare/?ids=1&ids={huge}", 400),  # SQLite OverflowError: a 500
        (f"/api/experiments/{huge}/", 404),  # the same, through the path
        ("/api/experiments/null/", 404),  # Django's HTML 404 page
        ("/api/studies/%C3%90a/export/", 404),
        ("/api/experiments/compare/export/?ids=1", 404),  # a literal path, not <pk> = compare
    ):
        response = client.get(path)
        assert (response.status_code, response["Content-Type"]) == (status, "application/json")
        assert response.json()["error"], path
    # A multipart body Django cannot parse (no boundary): Django's own 400 page, not JSON.
    response = client.post("/api/experiments/import/", "junk", content_type="multipart/form-data")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]
