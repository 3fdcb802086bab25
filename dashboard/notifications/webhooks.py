"""Webhook calls that cannot be aimed at the inside: the server's own ports, the cloud's
metadata address, the private network (SSRF).

The URL's host is resolved and every address it gives must be global (`is_global`), when the URL
is saved (the form says why not) and again when it is called. The call then connects to the
address that was checked, with the URL's host in the Host header and in TLS (SNI and the
certificate check), so a DNS answer that changes between the check and the call (rebinding)
cannot send it elsewhere. Redirects are not followed, and only the status code of the answer
is used: its body is never read, so nothing of an internal page can come back.

TRAINYARD_WEBHOOK_ALLOW_PRIVATE=1 lets a trusted deployment (and the tests' receiver on
127.0.0.1) call private addresses.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from requests.utils import DEFAULT_CA_BUNDLE_PATH

DEFAULT_PORTS = {"http": 80, "https": 443}


class WebhookRefused(Exception):
    """The URL may not be called; the message says why, for the form and the delivery's row."""


@dataclass(frozen=True)
class Target:
    """Where a webhook URL goes: the address checked, and what the request says it is for."""

    scheme: str
    host: str  # the name, for SNI and the certificate check
    host_header: str  # host[:port], as the URL wrote it
    port: int
    path: str  # path and query
    address: str


def host_addresses(host: str, port: int) -> list[str]:
    """Every address the host resolves to (an address literal resolves to itself)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _address_check(host: str, address: str) -> None:
    # A scoped IPv6 address (fe80::1%eth0) names its interface after the %.
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if not ip.is_global and not settings.TRAINYARD_WEBHOOK_ALLOW_PRIVATE:
        where = host if host == str(ip) else f"{host} resolves to {ip}, which"
        raise WebhookRefused(
            f"{where} is not a public internet address (private, loopback, link-local or "
            "reserved): webhooks are never sent inside this network"
        )


def webhook_target(url: str) -> Target:
    """The checked target of `url`; raises WebhookRefused with the reason."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise WebhookRefused("a webhook URL is http:// or https:// and a host")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        raise WebhookRefused("the URL's port is not a number from 1 to 65535") from None
    host = parts.hostname
    try:
        addresses = host_addresses(host, port)
    except (OSError, UnicodeError) as exc:
        raise WebhookRefused(f"cannot resolve {host}: {exc}") from None
    if not addresses:
        raise WebhookRefused(f"{host} has no address")
    for address in addresses:
        _address_check(host, address)
    return Target(
        scheme=scheme,
        host=host,
        host_header=parts.netloc.rpartition("@")[2],  # never the user:password of the URL
        port=port,
        path=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
        address=addresses[0],
    )


def _pool(target: Target, timeout: urllib3.Timeout) -> urllib3.HTTPConnectionPool:
    if target.scheme == "http":
        return urllib3.HTTPConnectionPool(target.address, target.port, timeout=timeout, maxsize=1)
    # Connected to the address, but TLS speaks to and verifies the URL's host, as requests would.
    return urllib3.HTTPSConnectionPool(
        target.address,
        target.port,
        timeout=timeout,
        maxsize=1,
        cert_reqs="CERT_REQUIRED",
        ca_certs=DEFAULT_CA_BUNDLE_PATH,
        server_hostname=target.host,
        assert_hostname=target.host,
    )


def webhook_post(url: str, *, body: bytes, headers: dict[str, str], timeout: float) -> int:
    """POST `body` to the checked address of `url`; the answer's status code.

    `timeout` bounds the connection and the whole wait for the answer's head; the body of the
    answer is never read (nothing of it is kept), so a receiver that streams cannot hold us.
    Raises WebhookRefused, or urllib3's HTTPError when there is no answer.
    """
    target = webhook_target(url)
    pool = _pool(target, urllib3.Timeout(total=timeout))
    try:
        response = pool.urlopen(
            "POST",
            target.path,
            body=body,
            headers={**headers, "Host": target.host_header},
            redirect=False,
            retries=False,
            preload_content=False,
        )
        status = int(response.status)
        response.close()
        return status
    finally:
        pool.close()
