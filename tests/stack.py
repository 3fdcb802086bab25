"""A real Trainyard stack for tests: Redis, the ASGI server (daphne) and a Celery worker.

Each runs as its own process on free ports, over a fresh database (a SQLite file, or a database on
the PostgreSQL pass's server: tests/conftest.py); tests talk to it only as a user would, over HTTP
and WebSocket, and read its rows with `Stack.query`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from dashboard.serving import daphne_command, free_port, port_open, redis_command, wait_for

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL the whole service, pool children included: a machine or container dying."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def service_start(*, name: str, command: list[str], env: dict[str, str], logs: Path) -> Service:
    log_path = logs / f"{name}.log"
    with log_path.open("wb") as out:
        # A session of its own, so a test can kill one service outright (killpg) as a crash would.
        process = subprocess.Popen(  # noqa: S603
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Service(name, process, log_path)


@dataclass
class Stack:
    base_url: str
    redis_url: str
    database_url: str
    env: dict[str, str]
    logs: Path
    services: dict[str, Service] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def ws_url(self) -> str:
        return self.base_url.replace("http://", "ws://")

    def manage(self, *args: str, input_text: str | None = None) -> str:
        result = subprocess.run(  # noqa: S603
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def user_create(self, username: str, *, staff: bool = False) -> None:
        password = f"pw-{username}-{os.getpid()}"
        code = (
            "from django.contrib.auth import get_user_model as g;"
            f"g().objects.create_user({username!r}, password={password!r}, is_staff={staff})"
        )
        self.manage("shell", "-c", code)
        self.passwords[username] = password

    def login(self, username: str) -> requests.Session:
        session = requests.Session()
        page = session.get(f"{self.base_url}/accounts/login/", timeout=10)
        page.raise_for_status()
        response = session.post(
            f"{self.base_url}/accounts/login/",
            data={
                "username": username,
                "password": self.passwords[username],
                "csrfmiddlewaretoken": session.cookies["csrftoken"],
            },
            headers={"Referer": f"{self.base_url}/accounts/login/"},
            timeout=10,
        )
        response.raise_for_status()
        assert "sessionid" in session.cookies, f"login of {username} failed"
        session.headers["X-CSRFToken"] = str(session.cookies["csrftoken"])
        session.headers["Referer"] = self.base_url + "/"
        return session

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of `sql` (`?` placeholders) on either engine; JSON columns come back as their
        text on both, as SQLite stores them."""
        if self.database_url.startswith("sqlite:///"):
            import sqlite3

            path = self.database_url.removeprefix("sqlite:///")
            with sqlite3.connect(path, timeout=20) as connection:
                return list(connection.execute(sql, params))
        import psycopg
        from psycopg.types.string import TextLoader

        with psycopg.connect(self.database_url, autocommit=True) as connection:
            connection.adapters.register_loader("jsonb", TextLoader)
            return list(connection.execute(sql.replace("?", "%s"), params))  # type: ignore[arg-type]

    def experiment_row(self, pk: int) -> dict[str, Any]:
        (row,) = self.query(
            "SELECT status, launcher_pid, run_info FROM experiments_experiment WHERE id = ?", pk
        )
        return {"status": row[0], "launcher_pid": row[1], "run_info": json.loads(row[2] or "{}")}

    def worker_start(self) -> None:
        self.services["worker"] = worker_start(self)

    def redis_restart(self, *, down_seconds: float) -> None:
        self.services["redis"].kill()
        time.sleep(down_seconds)
        port = int(self.redis_url.rsplit(":", 1)[1].split("/")[0])
        self.services["redis"], _ = redis_start(logs=self.logs, port=port)

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {name} (exit {s.process.poll()}) ---\n{s.log_tail()}"
            for name, s in self.services.items()
        )


def redis_start(*, logs: Path, port: int | None = None) -> tuple[Service, str]:
    port = port or free_port()
    service = service_start(
        name="redis", command=redis_command(port=port), env=dict(os.environ), logs=logs
    )
    wait_for(lambda: port_open(port), timeout=15, what="redis")
    return service, f"redis://127.0.0.1:{port}/0"


def worker_start(stack: Stack) -> Service:
    command = [
        sys.executable, "-m", "celery", "-A", "dashboard", "worker", "--pool", "prefork",
        "--concurrency", "2", "--loglevel", "INFO", "-n", "test-worker@%h",
        "--without-gossip", "--without-mingle",
    ]  # fmt: skip
    return service_start(name="worker", command=command, env=stack.env, logs=stack.logs)


@contextmanager
def stack_running(
    *, home: Path, data_dir: Path, database_url: str | None = None,
    env_extra: dict[str, str] | None = None,
) -> Iterator[Stack]:  # fmt: skip
    """The stack over `database_url` (an empty database), by default a new SQLite file in home;
    `env_extra`: settings of its own for every process (a Slurm cluster's, tests/test_slurm.py)."""
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    redis, redis_url = redis_start(logs=logs)
    web_port = free_port()
    database_url = database_url or f"sqlite:///{home / 'stack.sqlite3'}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
        "TRAINYARD_HOME": str(home),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "TRAINYARD_DATA_DIR": str(data_dir),
        "TRAINYARD_WORKER_NAME": "test-worker",
        "TRAINYARD_DEVICE_REPORT_SECONDS": "2",
        # Short bounds, so that a lost worker is noticed within a test's patience.
        "TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS": "8",
        "TRAINYARD_REAPER_SECONDS": "2",
        # The suite launches more runs per user than a person would; limits have tests of their own.
        "TRAINYARD_MAX_ACTIVE_RUNS_PER_USER": "0",
        "TRAINYARD_MAX_QUEUED_RUNS_PER_USER": "0",
        "TRAINYARD_LAUNCH_RATE_PER_MINUTE": "0",
        # The tests' webhook receivers listen on 127.0.0.1, which webhooks otherwise refuse.
        "TRAINYARD_WEBHOOK_ALLOW_PRIVATE": "1",
        # A script run stalled after 8 s without a step, not 60 (the stall test's hung rank);
        # the stack's other scripts step every 50 ms.
        "TRAINYARD_STALL_SECONDS": "8",
        "PYTHONUNBUFFERED": "1",
        "TRAINYARD_DEBUG": "1",  # the local dashboard, as `make run` serves it
        **(env_extra or {}),
    }
    stack = Stack(f"http://127.0.0.1:{web_port}", redis_url, database_url, env, logs)
    stack.services["redis"] = redis
    try:
        stack.manage("migrate", "--noinput", "-v", "0")
        # The Procfile's daphne flags: tests meet the limits a user's server has.
        web = daphne_command(port=web_port)
        stack.services["web"] = service_start(name="web", command=web, env=env, logs=logs)
        stack.services["worker"] = worker_start(stack)
        beat = [sys.executable, "-m", "celery", "-A", "dashboard", "beat", "--loglevel", "INFO",
                "--schedule", str(home / "celerybeat-schedule")]  # fmt: skip
        stack.services["beat"] = service_start(name="beat", command=beat, env=env, logs=logs)
        wait_for(lambda: port_open(web_port), timeout=60, what="daphne")
        yield stack
    finally:
        for name in ("beat", "worker", "web", "redis"):
            if name in stack.services:
                stack.services[name].stop()
