"""daphne's HTTP request, changed so that every answer under /api/ is the API's JSON, even one
the server gives before Django sees the request.

Three refusals happen in daphne and Twisted, below the ASGI application:
- Twisted's `Request.requestReceived` parses every multipart POST body into `request.args`
  (which daphne never reads: it hands the raw body to the application) and, where the email
  parser finds no parts (`--BOUNDARY--` alone), answers a bare 400 with no body and drops the
  connection. Turning that parsing off (Twisted's own `parsePOSTFormSubmission` switch) lets
  Django's parser and the API's JSON 400 answer instead, and spares a second in-memory copy of
  every upload.
- daphne answers a header name or value, a path or a query string it refuses with an HTML page
  (`basic_error`); under /api/ that page is the API's error shape instead.
- Twisted's HTTP channel answers a request it cannot parse at all (a header name with a space
  or a bracket, a bad request line, a header block over its size limit) with a bare
  `HTTP/1.1 400 Bad Request` and no headers; under /api/ it gets the JSON too.

`install()` (called by dashboard/asgi.py, which daphne and its runserver load before serving)
swaps the request class daphne's HTTP factory builds: daphne has no setting for it.
"""

from __future__ import annotations

import functools
from typing import Any

from daphne import http_protocol
from twisted.web import http

from dashboard.api import error_response

API_PREFIX = b"/api/"
MALFORMED = "the request is not well-formed HTTP"


class ApiAwareRequest(http_protocol.WebRequest):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["parsePOSTFormSubmission"] = False
        super().__init__(*args, **kwargs)
        # A channel makes this request on the request line, before it parses anything else.
        if isinstance(self.channel, http.HTTPChannel):
            refuse = functools.partial(_malformed, self.channel)
            self.channel._respondToBadRequestAndDisconnect = refuse  # type: ignore[method-assign]

    def basic_error(self, status: int, status_text: bytes, body: str) -> None:
        if not (getattr(self, "path", None) or b"").startswith(API_PREFIX):
            super().basic_error(status, status_text, body)
            return
        answer = error_response(status, body.lower())
        headers = [(b"Content-Type", answer["Content-Type"].encode("ascii"))]
        self.handle_reply({"type": "http.response.start", "status": status, "headers": headers})
        self.handle_reply({"type": "http.response.body", "body": answer.content})


def _malformed(channel: http.HTTPChannel) -> None:
    """Twisted's bare 400 (HTTPChannel._respondToBadRequestAndDisconnect), as JSON under /api/."""
    if not (getattr(channel, "_path", None) or b"").startswith(API_PREFIX):
        http.HTTPChannel._respondToBadRequestAndDisconnect(channel)
        return
    answer = error_response(400, MALFORMED)
    head = (
        f"HTTP/1.1 400 Bad Request\r\nContent-Type: {answer['Content-Type']}\r\n"
        f"Content-Length: {len(answer.content)}\r\nConnection: close\r\n\r\n"
    )
    transport: Any = channel.transport  # Twisted types it as the interface, not the TCP one
    transport.write(head.encode("ascii") + answer.content)
    channel.loseConnection()


def install() -> None:
    # HTTPFactory.buildProtocol reads the module's WebRequest for each new connection.
    http_protocol.WebRequest = ApiAwareRequest
