"""Starting the web server as `make run` does, for tests and benchmarks.

daphne gets the Procfile's own flags (read from the Procfile, their one home), so that what the
tests and benchmarks measure is the server a user runs: the WebSocket size limit that once broke
every long run's page was a Procfile flag the test stack did not pass. Redis is a throwaway one on
a free port, so that a benchmark's channel groups (named by run id) never reach the user's pages.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dashboard.paths import SOURCE_DIR

ROOT = Path(__file__).resolve().parent.parent
PROCFILE = SOURCE_DIR / "Procfile"  # a clone's, or the copy an installed wheel carries
ASGI_APPLICATION = "dashboard.asgi:application"
# Debian's Chromium (Playwright's own browsers are never installed here), with the flags that let
# it run headless as root in a container: browser tests and bench_charts launch it alike.
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for(predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def procfile_daphne_flags(procfile: Path = PROCFILE) -> list[str]:
    """The `--websocket-...` options of the Procfile's `web:` line, with their values."""
    for line in procfile.read_text().splitlines():
        name, _, command = line.partition(":")
        if name.strip() != "web":
            continue
        words = shlex.split(command)
        flags: list[str] = []
        for index, word in enumerate(words):
            if word.startswith("--websocket-"):
                flags += [word, words[index + 1]]
        return flags
    raise ValueError(f"{procfile} has no web: line")


def daphne_command(*, port: int) -> list[str]:
    """daphne as the Procfile starts it, on this interpreter and a port of the caller's choice."""
    return [
        sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
        *procfile_daphne_flags(), ASGI_APPLICATION,
    ]  # fmt: skip


def redis_command(*, port: int) -> list[str]:
    """A Redis that keeps nothing on disk: throwaway channel layers and brokers."""
    from dashboard.management.commands.serve_redis import redis_binary

    return [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no"]  # fmt: skip


@contextmanager
def process_running(
    command: list[str], *, env: dict[str, str], log: Path, port: int, what: str
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, once its port answers; terminated (then killed) on the way out."""
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 - our own command lines
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: port_open(port) or process.poll() is not None, timeout=60, what=what)
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode}:\n{log.read_text()[-3000:]}")
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def servers_running(*, home: Path) -> Iterator[str]:
    """Redis on REDIS_URL's port (a throwaway_rerun's own) and daphne (the Procfile's flags) on a
    free port, with this process' environment (its database, so its settings); yields the base
    URL."""
    from django.conf import settings

    redis_port, web_port = int(urlsplit(settings.REDIS_URL).port or 6379), free_port()
    servers = (
        ("redis", redis_command(port=redis_port), redis_port),
        ("daphne", daphne_command(port=web_port), web_port),
    )
    with ExitStack() as stack:
        for name, command, port in servers:
            log = home / f"{name}.log"
            env = dict(os.environ)
            stack.enter_context(process_running(command, env=env, log=log, port=port, what=name))
        yield f"http://127.0.0.1:{web_port}"


def throwaway_rerun(*, argv: list[str], marker: str) -> int:
    """Run `manage.py <argv>` again in a throwaway home: a temporary TRAINYARD_HOME, SQLite
    database, runs folder and Redis port (settings are read once per process, so the benchmark
    needs a process of its own; the user's var/ and Redis are never touched). `marker` is set in
    its environment so the command knows it is the child. Returns its exit status."""
    from django.conf import settings

    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        env = {
            **os.environ,
            marker: "1",
            "TRAINYARD_HOME": tmp,
            "DATABASE_URL": f"sqlite:///{Path(tmp) / 'bench.sqlite3'}",
            "TRAINYARD_RUNS_DIR": str(Path(tmp) / "runs"),
            "TRAINYARD_DATA_DIR": str(settings.TRAINYARD_DATA_DIR),
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "DJANGO_ALLOW_ASYNC_UNSAFE": "true",  # Playwright's sync API in a command
        }
        command = [sys.executable, str(ROOT / "manage.py"), *argv]
        return subprocess.run(command, env=env, cwd=ROOT, check=False).returncode  # noqa: S603


def session_cookie(user: Any) -> str:
    """A logged-in session of `user` in the configured database: the cookie's value."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    return str(client.cookies[settings.SESSION_COOKIE_NAME].value)
