"""The request body limit over HTTP/2 (dashboard/http_server.py). daphne speaks HTTP/2 wherever it
serves TLS itself (docs/guides/production.md's recipe; twisted[http2] is installed), and browsers
pick it: the request is then one stream of a connection that others share, its path is the stream's
:path and it has no TCP transport of its own to write an answer to. Against a real daphne over TLS,
with a small HTTP/2 client on the h2 library that Twisted's HTTP/2 uses. No database: every answer
here comes before Django opens one.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import ssl
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dashboard.serving import (
    ASGI_APPLICATION,
    free_port,
    process_running,
    procfile_daphne_flags,
)

pytestmark = pytest.mark.integration

IMPORT = "/api/experiments/import/"


@dataclass
class Answer:
    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    done: bool = False

    def json(self) -> object:
        return json.loads(self.body)


class Client:
    """One HTTP/2 connection; each request a stream, its body sent as flow control allows."""

    def __init__(self, port: int) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        assert self.sock.selected_alpn_protocol() == "h2"
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.initiate_connection()
        self.answers: dict[int, Answer] = {}
        self._flush()

    def close(self) -> None:
        self.sock.close()

    def _flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def _read(self) -> None:
        data = self.sock.recv(65536)  # socket.timeout: the server said nothing
        if not data:
            raise ConnectionError("the server closed the connection")
        for event in self.conn.receive_data(data):
            answer = self.answers.get(getattr(event, "stream_id", 0))
            if answer is None:
                continue
            if isinstance(event, h2.events.ResponseReceived):
                answer.headers = dict(event.headers)
                answer.status = int(answer.headers[b":status"])
            elif isinstance(event, h2.events.DataReceived):
                answer.body += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                answer.done = True
        self._flush()

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        declared: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> int:
        """A request's headers, then its body while the server takes it. `declared`: the
        Content-Length said (none said where it is -1)."""
        stream = self.conn.get_next_available_stream_id()
        said = len(body) if declared is None else declared
        length = [] if said < 0 else [("content-length", str(said))]
        self.conn.send_headers(stream, [
            (":method", method), (":path", path), (":scheme", "https"),
            (":authority", "127.0.0.1"), *length, *headers,
        ])  # fmt: skip
        self.answers[stream] = answer = Answer()
        self._flush()
        sent = 0
        while sent < len(body) and not answer.done:
            room = min(self.conn.local_flow_control_window(stream),
                       self.conn.max_outbound_frame_size, len(body) - sent)  # fmt: skip
            if room <= 0:
                self._read()
                continue
            try:
                self.conn.send_data(stream, body[sent : sent + room])
            except h2.exceptions.StreamClosedError:
                break
            sent += room
            self._flush()
        if not answer.done and declared is None:
            self.conn.end_stream(stream)
            self._flush()
        return stream

    def answer(self, stream: int) -> Answer:
        answer = self.answers[stream]
        while not answer.done:
            self._read()
        return answer


def _certificate(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_path, cert_path = folder / "tls.key", folder / "tls.crt"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """daphne serving TLS itself, as docs/guides/production.md's recipe starts it."""
    folder = tmp_path_factory.mktemp("http2")
    key, cert = _certificate(folder)
    port = free_port()
    endpoint = f"ssl:{port}:interface=127.0.0.1:privateKey={key}:certKey={cert}"
    command = [sys.executable, "-m", "daphne", "-e", endpoint, *procfile_daphne_flags(),
               ASGI_APPLICATION]  # fmt: skip
    log = folder / "daphne.log"
    with process_running(command, env=dict(os.environ), log=log, port=port, what="daphne"):
        yield port


@pytest.fixture
def client(tls_port: int) -> Iterator[Client]:
    made = Client(tls_port)
    yield made
    made.close()


def multipart(size: int) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    rows = b"step,loss\n" + b"".join(b"%d,0.5\n" % step for step in range(1, size // 6))
    body = (
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="big.csv"\r\n'
        b"Content-Type: text/csv\r\n\r\n" + rows + b"\r\n--B--\r\n"
    )
    return body, (("content-type", "multipart/form-data; boundary=B"),)


def test_an_upload_over_the_json_limit_reaches_its_route(client: Client) -> None:
    # Was no answer at all: the stream's path was never read (every route took 64 KiB), and
    # the 413 was written to the stream's transport, which HTTP/2 streams do not have
    # (AttributeError), which broke the whole connection.
    body, headers = multipart(120_000)
    assert len(body) > 64 * 1024
    answer = client.answer(client.send("POST", IMPORT, body, headers=headers))
    # The API's own answer to a caller without a login: the server let the body through.
    assert answer.status == 401, (answer.status, answer.body[:300])
    assert answer.json() == {"error": "login or an API token is required"}


def test_a_body_over_its_limit_is_refused_on_its_stream_and_the_connection_goes_on(
    client: Client,
) -> None:
    # 100 MB declared, none of it sent: the 413 comes at once.
    api = client.answer(client.send("POST", "/api/experiments/", declared=10**8))
    assert api.status == 413, (api.status, api.body[:300])
    assert api.headers[b"content-type"] == b"application/json"
    assert api.json() == {"error": "request body over 65536 bytes"}
    page = client.answer(client.send("POST", "/accounts/login/", declared=10**8))
    assert page.status == 413 and page.headers[b"content-type"].startswith(b"text/html")
    # An upload route's own limit, read from the stream's path.
    upload = client.answer(client.send("POST", IMPORT, declared=10**10))
    assert upload.status == 413
    assert upload.json() == {"error": "request body over 52494336 bytes"}  # and 64 KiB of form
    # A body with no length, counted as it comes.
    counted = client.answer(
        client.send(
            "POST",
            "/api/experiments/",
            b" " * 80 * 1024,
            declared=-1,
            headers=(("content-type", "application/json"),),
        )  # fmt: skip
    )
    assert counted.status == 413, (counted.status, counted.body[:300])
    # The connection's other streams were not touched.
    after = client.answer(client.send("GET", "/api/experiments/"))
    assert after.status == 401, (after.status, after.body[:300])
