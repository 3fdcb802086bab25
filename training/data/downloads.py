"""Whether a dataset may be downloaded here: not with ``TRAINYARD_NO_DOWNLOAD`` set, and only
from a host that answers a short TCP connect (so an offline machine does not hang)."""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 3.0


def downloads_disabled() -> bool:
    return os.environ.get("TRAINYARD_NO_DOWNLOAD", "").lower() not in ("", "0", "false", "no")


def reachable_mirror(mirrors: list[str]) -> str | None:
    if downloads_disabled():
        return None
    for url in mirrors:
        parts = urlsplit(url)
        if parts.hostname and _can_connect(
            parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        ):
            return parts.hostname
    return None


def _can_connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    # In a thread because name resolution ignores socket timeouts and can hang offline.
    result: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])
