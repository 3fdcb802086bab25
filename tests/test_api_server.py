"""Every answer under /api/ is the API's JSON error shape, whichever layer refuses the request:
the operation (an unparseable multipart upload), Django before any operation (an unknown path,
a refused Host), daphne and Twisted below the ASGI application (a multipart body Twisted's own
form parser refused, a header line it cannot parse). Against the real daphne of the stack, since
the lower layers are not in Django's test client; outside /api/ the server's answers stay.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from tests.stack import Stack

# sqlite_only: every refusal here comes before the database, and the import's rows are
# test_import's, in process, on both engines.
pytestmark = pytest.mark.sqlite_only

IMPORT = "/api/experiments/import/"


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    return stack.manage("create_token", "alice").strip()


def api_error(response: requests.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response.headers.get("Content-Type") == "application/json", response.headers
    body = response.json()
    assert isinstance(body["error"], str) and body["error"], body
    assert set(body) <= {"error", "errors", "limit", "retry_after"}, body
    return body


def post(stack: Stack, key: str, content_type: str, body: bytes) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": content_type}
    return requests.post(stack.base_url + IMPORT, data=body, headers=headers, timeout=30)


def raw(stack: Stack, request: bytes) -> bytes:
    """What the server sends back for these exact bytes (requests refuses to send bad ones)."""
    where = urlsplit(stack.base_url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_a_multipart_import_without_a_boundary_is_a_json_400(stack: Stack, key: str) -> None:
    # Was a 500 (Django's MultiPartParserError out of request.FILES; ninja's default handler
    # answers it with a text/plain traceback under DEBUG, which the stack runs with).
    for body in (b"", b"--BOUNDARY--"):
        found = api_error(post(stack, key, "multipart/form-data", body), 400)
        assert "boundary" in found["error"], found


def test_an_empty_multipart_body_reaches_the_api(stack: Stack, key: str) -> None:
    # Was a bare 400 with no headers: Twisted's form parsing refused a multipart with no parts.
    for body in (b"--BOUNDARY--", b"--BOUNDARY--\r\n"):
        found = api_error(post(stack, key, "multipart/form-data; boundary=BOUNDARY", body), 400)
        assert found["errors"] == {"file": ["required"]}, found


def test_a_real_upload_still_imports_through_daphne(stack: Stack, key: str) -> None:
    response = requests.post(
        stack.base_url + IMPORT,
        files={"file": ("mine.csv", b"step,loss\n1,0.5\n2,0.25\n", "text/csv")},
        data={"name": "through daphne"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    assert response.json()["name"] == "through daphne"


def test_what_django_answers_before_an_operation_is_json(stack: Stack, key: str) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    for path in ("/api/nope/", "/api/experiments/1/nope/", "/api"):
        found = api_error(requests.get(stack.base_url + path, headers=auth, timeout=30), 404)
        assert "no such API path" in found["error"], found
    bad_host = {**auth, "Host": "elsewhere.example"}
    api_error(requests.get(stack.base_url + "/api/experiments/", headers=bad_host, timeout=30), 400)
    # Pages keep Django's own answer.
    page = requests.get(stack.base_url + "/no-such-page/", timeout=30)
    assert page.status_code == 404 and page.headers["Content-Type"].startswith("text/html")


def test_a_request_twisted_cannot_parse_is_json_under_the_api(stack: Stack) -> None:
    for name in (b"Bad Name", b"Bad(Name"):
        request = b"GET /api/experiments/ HTTP/1.1\r\nHost: x\r\n%s: 1\r\n\r\n" % name
        head, _, body = raw(stack, request).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), head
        assert b"Content-Type: application/json" in head, head
        assert b'{"error": ' in body, body
    # Elsewhere, Twisted's own bare 400.
    page = raw(stack, b"GET /accounts/login/ HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n")
    assert page == b"HTTP/1.1 400 Bad Request\r\n\r\n", page
