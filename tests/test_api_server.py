"""Every answer under /api/ is the API's JSON error shape, whichever layer refuses the request:
the operation (an unparseable multipart upload), Django before any operation (an unknown path,
a refused Host), daphne and Twisted below the ASGI application (a multipart body Twisted's own
form parser refused, a header line it cannot parse). Against the real daphne of the stack, since
the lower layers are not in Django's test client; outside /api/ the server's answers stay. A
body over its route's limit is refused by daphne's request before it is read (413).
"""

from __future__ import annotations

import json
import re
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


# ---- a body over its route's limit, refused before it is read ----


def answer_to(stack: Stack, request: bytes, body_chunks: tuple[bytes, ...] = ()) -> bytes:
    """The server's whole answer to these headers (then these body chunks, while it has not
    answered), read as soon as its Content-Length is in: the server keeps the connection open a
    moment after a refusal, so waiting for it to close would say nothing."""
    where = urlsplit(stack.base_url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as connection:
        connection.sendall(request)
        for chunk in body_chunks:
            connection.sendall(chunk)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < _answer_length(answer):
            chunk = connection.recv(65536)  # socket.timeout: no answer came
            if not chunk:
                break
            answer += chunk
    return answer


def _answer_length(answer: bytes) -> int:
    head, _, _ = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    return len(head) + 4 + int(length.group(1)) if length else len(answer) + 1


def declared(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def test_a_body_over_its_routes_limit_is_refused_by_its_length_before_it_is_read(
    stack: Stack, key: str
) -> None:
    # 100 MB declared, not a byte of it sent. On main daphne waited for all of it (kept on disk
    # past 100 KB) before Django's 413: this read timed out.
    auth = f"Authorization: Bearer {key}"
    json_route = answer_to(stack, declared("/api/experiments/", 10**8, auth, "Content-Type: x"))
    head, _, body = json_route.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert b"Content-Type: application/json" in head, head
    assert json.loads(body) == {"error": "request body over 65536 bytes"}
    # A page's form: the same limit (Django's DATA_UPLOAD_MAX_MEMORY_SIZE), daphne's page.
    page = answer_to(stack, declared("/accounts/login/", 10**8))
    assert page.startswith(b"HTTP/1.1 413 ") and b"text/html" in page, page[:300]
    # An upload route takes its own limit, and the answer comes before any 100 Continue.
    upload = answer_to(stack, declared(IMPORT, 10**10, auth, "Expect: 100-continue"))
    assert upload.startswith(b"HTTP/1.1 413 "), upload[:300]
    assert b"100 Continue" not in upload
    assert b"request body over 52494336 bytes" in upload, upload[-300:]  # and 64 KiB of form


def test_a_chunked_body_is_counted_as_it_comes(stack: Stack, key: str) -> None:
    request = (
        "POST /api/experiments/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n\r\n"
    ).encode("ascii")
    chunk = b"%x\r\n%s\r\n" % (16384, b" " * 16384)
    answer = answer_to(stack, request, (chunk,) * 5)  # 80 KiB, over 64 KiB
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert json.loads(body) == {"error": "request body over 65536 bytes"}


def test_an_upload_over_the_json_limit_but_within_its_own_still_imports(
    stack: Stack, key: str
) -> None:
    rows = "".join(f"{step},{1 / step:.12f}\n" for step in range(1, 6001))
    csv = ("step,loss\n" + rows).encode("ascii")
    assert len(csv) > 64 * 1024
    response = requests.post(
        stack.base_url + IMPORT,
        files={"file": ("big.csv", csv, "text/csv")},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert response.status_code == 201, response.text
