"""daphne's HTTP request, changed so that a request body over its route's limit is refused
before it is read, and every answer under /api/ is the API's JSON, even one the server gives
before Django sees the request.

daphne has no limit on request bodies: Twisted keeps each whole (in a temporary file past
100 KB) before daphne hands it to the application, whose own checks (DATA_UPLOAD_MAX_MEMORY_SIZE,
the uploads' caps) then come after the disk has filled. So the request checks the body's size
here, against the most its route takes (`body_limit`): by its Content-Length as soon as the
headers are in, and by the bytes that arrive for a chunked one. Over it, a 413 (JSON under
/api/), and nothing of the body is kept. Over HTTP/2 (daphne speaks it where it serves TLS
itself) the request is a stream of a shared connection: the 413 goes on that stream, which is
then reset, and the connection's other streams go on.

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
from urllib.parse import unquote

from daphne import http_protocol
from django.conf import settings
from django.urls import Resolver404, resolve
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.web import http

from dashboard.api import body_too_big, error_response

API_PREFIX = b"/api/"
MALFORMED = "the request is not well-formed HTTP"
# A refused body's connection stays open this long, its bytes dropped, so that a client still
# sending reads the 413: a socket closed with unread data resets the connection, and with it the
# answer.
LINGER_SECONDS = 2.0


def body_limit(raw_path: bytes) -> int:
    """The most bytes a request to this path may send: its route's (an upload's, dashboard/api.py
    `gate`), else what Django takes in a body (DATA_UPLOAD_MAX_MEMORY_SIZE)."""
    most = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    try:
        match = resolve(unquote(raw_path.split(b"?", 1)[0].decode("ascii")))
    except (UnicodeDecodeError, Resolver404):
        return most
    route_most = getattr(match.func, "body_most", None)
    return max(most, route_most()) if route_most is not None else most


class ApiAwareRequest(http_protocol.WebRequest):
    body_most = 0
    body_received = 0
    body_refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["parsePOSTFormSubmission"] = False
        super().__init__(*args, **kwargs)
        # A channel makes this request on the request line, before it parses anything else.
        if isinstance(self.channel, http.HTTPChannel):
            refuse = functools.partial(_malformed, self.channel)
            self.channel._respondToBadRequestAndDisconnect = refuse  # type: ignore[method-assign]

    # ---- the body's size (Twisted calls these as the request comes in) ----

    def gotLength(self, length: int | None) -> None:
        self.body_most = body_limit(_channel_path(self.channel))
        if length is not None and length > self.body_most:
            self._body_refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.body_refused:
            return
        self.body_received += len(data)
        if self.body_received > self.body_most:  # a chunked body, counted as it comes
            self.content.close()
            self._body_refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self.body_refused:
            # The whole body came and was dropped: answered. An HTTP/2 stream is closed by
            # its own answer (_stream_refuse), the connection being others' too.
            if isinstance(self.channel, http.HTTPChannel):
                self.channel.loseConnection()
            return
        super().requestReceived(command, path, version)

    def _body_refuse(self) -> None:
        self.body_refused = True
        # Twisted answers an `Expect: 100-continue` after this call: not after our answer.
        self.requestHeaders.removeHeader(b"expect")
        message = body_too_big(self.body_most)
        if _channel_path(self.channel).startswith(API_PREFIX):
            answer = error_response(413, message)
            content_type, body = answer["Content-Type"], answer.content
        else:
            page = self.error_template % {"title": "413 Request Entity Too Large", "body": message}
            content_type, body = "text/html; charset=utf-8", page.encode("utf-8")
        # Imported here: daphne installs its asyncio reactor before it serves, and an import
        # at the module's load would install Twisted's default one first wherever asgi.py is
        # imported without daphne (tests).
        from twisted.internet import reactor

        clock: Any = reactor  # typed as the module, not the reactor it is
        if isinstance(self.channel, http.HTTPChannel):
            _answer_raw(self.channel, 413, content_type, body)
            clock.callLater(LINGER_SECONDS, self.channel.loseConnection)
        else:
            # HTTP/2: Twisted calls gotLength while it makes the stream, before the connection
            # holds it; the answer goes out on the next turn of the reactor.
            clock.callLater(0, _stream_refuse, self.channel, content_type, body)

    def basic_error(self, status: int, status_text: bytes, body: str) -> None:
        if not (getattr(self, "path", None) or b"").startswith(API_PREFIX):
            super().basic_error(status, status_text, body)
            return
        answer = error_response(status, body.lower())
        headers = [(b"Content-Type", answer["Content-Type"].encode("ascii"))]
        self.handle_reply({"type": "http.response.start", "status": status, "headers": headers})
        self.handle_reply({"type": "http.response.body", "body": answer.content})


def _channel_path(channel: Any) -> bytes:
    # HTTP/1.1: the request line's target, which the channel keeps until the request is whole;
    # HTTP/2: the stream's :path (Twisted's H2Stream), which comes before its other headers.
    if isinstance(channel, http.HTTPChannel):
        return getattr(channel, "_path", None) or b""
    return getattr(channel, "path", None) or b""


def _stream_refuse(stream: Any, content_type: str, body: bytes) -> None:
    """HTTP/2: the 413 on the refused body's stream alone, then RST_STREAM with NO_ERROR, which
    asks the client to stop sending the body (RFC 9113, 8.1) and has the h2 library drop what
    still comes of it; the connection's other streams go on. An HTTP/2 stream has no transport
    to write to, and Twisted's own answer waits for the whole body."""
    connection = stream._conn  # Twisted's H2Connection
    if stream.streamID not in connection.streams:
        return  # the client reset the stream first
    h2, stream_id = connection.conn, stream.streamID
    head = [(b":status", b"413"), (b"content-type", content_type.encode("ascii"))]
    # A client may shrink its window below a page: then the status alone.
    if len(body) <= min(h2.local_flow_control_window(stream_id), h2.max_outbound_frame_size):
        h2.send_headers(stream_id, [*head, (b"content-length", str(len(body)).encode("ascii"))])
        h2.send_data(stream_id, body, end_stream=True)
    else:
        h2.send_headers(stream_id, head, end_stream=True)
    h2.reset_stream(stream_id, error_code=0)
    if connection._tryToWriteControlData():  # False: the connection itself is gone
        stream.connectionLost(Failure(ConnectionLost("request body over its limit")))
        connection._requestDone(stream_id)


def _malformed(channel: http.HTTPChannel) -> None:
    """Twisted's bare 400 (HTTPChannel._respondToBadRequestAndDisconnect), as JSON under /api/."""
    if not _channel_path(channel).startswith(API_PREFIX):
        http.HTTPChannel._respondToBadRequestAndDisconnect(channel)
        return
    answer = error_response(400, MALFORMED)
    _answer_raw(channel, 400, answer["Content-Type"], answer.content)
    channel.loseConnection()


def _answer_raw(channel: http.HTTPChannel, status: int, content_type: str, body: bytes) -> None:
    """An answer written to the connection itself, before the request is one daphne handles."""
    reason = http.RESPONSES[status].decode("ascii")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    transport: Any = channel.transport  # Twisted types it as the interface, not the TCP one
    transport.write(head.encode("ascii") + body)


def install() -> None:
    # HTTPFactory.buildProtocol reads the module's WebRequest for each new connection.
    http_protocol.WebRequest = ApiAwareRequest
