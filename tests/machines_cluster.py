"""A Trainyard installation over two machines for tests: each machine a network namespace of
tests/netns.py running a Celery worker (its own name and address), the web host's services in
the root namespace listening on the bridge where both reach them: PostgreSQL, Redis, daphne and
Celery beat. Runs share one TRAINYARD_RUNS_DIR, as docs/guides/several-machines.md says to."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from dashboard.serving import daphne_command, free_port, port_open, redis_command, wait_for
from tests.netns import Machine, Network, machines
from tests.postgres import Postgres, postgres_bin, postgres_running
from tests.stack import ROOT, Service, service_start


@dataclass
class Cluster:
    network: Network
    postgres: Postgres
    database_url: str
    base_url: str
    env: dict[str, str]
    logs: Path
    runs_dir: Path
    services: dict[str, Service] = field(default_factory=dict)
    token: str = ""

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return requests.request(method, f"{self.base_url}{path}", headers=headers, timeout=20,
                                **kwargs)  # fmt: skip

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.database_url.replace("postgres://", "postgresql://")) as db:
            return list(db.execute(sql, params))

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def worker_start(self, machine: Machine) -> None:
        env = {**self.env, "TRAINYARD_WORKER_NAME": machine.name,
               "TRAINYARD_WORKER_ADDRESS": machine.address}  # fmt: skip
        command = machine.command(
            ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "celery", "-A",
             "dashboard", "worker", "--pool", "prefork", "--concurrency", "2", "--loglevel",
             "INFO", "-n", f"{machine.name}@%h", "--without-gossip", "--without-mingle"]
        )  # fmt: skip
        self.services[machine.name] = service_start(
            name=machine.name, command=command, env=dict(os.environ), logs=self.logs
        )

    def training_pids(self, machine: Machine) -> set[int]:
        """The training processes (launcher, ranks) in this machine's network namespace."""
        found = set()
        for pid in machine.pids():
            with contextlib.suppress(psutil.Error):
                line = " ".join(psutil.Process(pid).cmdline())
                if "-m training" in line or "torch.distributed.run" in line:
                    found.add(pid)
        return found

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {name} (exit {s.process.poll()}) ---\n{s.log_tail(60)}"
            for name, s in self.services.items()
        )


def cluster_unavailable() -> str | None:
    from tests.netns import namespaces_unavailable

    reason = namespaces_unavailable()
    if reason is None and postgres_bin() is None:
        reason = "PostgreSQL's server is not installed (Debian package postgresql)"
    return reason


def postgres_open_to(postgres: Postgres, network: Network) -> None:
    """initdb's trust rules cover the loopback only: let the machines' network in too."""
    hba = postgres.folder / "pg_hba.conf"
    with hba.open("a") as rules:
        rules.write(f"host all all {network.host_address.rsplit('.', 1)[0]}.0/24 trust\n")
    binary = postgres_bin()
    assert binary is not None
    subprocess.run(["runuser", "-u", "postgres", "--", str(binary / "pg_ctl"), "-D",
                    str(postgres.folder), "reload"], check=True, capture_output=True)  # fmt: skip


@contextlib.contextmanager
def cluster_running(*, home: Path, data_dir: Path, env: dict[str, str]) -> Iterator[Cluster]:
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with machines(2) as network, contextlib.ExitStack() as stack:
        bridge = network.host_address
        postgres = stack.enter_context(
            postgres_running(port=free_port(), listen=f"127.0.0.1,{bridge}")
        )
        postgres_open_to(postgres, network)
        url = postgres.database_create("trainyard").replace("@127.0.0.1:", f"@{bridge}:")
        redis_port = free_port()
        redis = redis_command(port=redis_port)
        # Reached from the machines' network, which Redis' protected mode would refuse.
        # Only the bind value changes: the flags after it keep Redis off the disk (no dump.rdb).
        redis[redis.index("--bind") + 1] = f"127.0.0.1 {bridge}"
        redis += ["--protected-mode", "no"]
        web_port = free_port()
        cluster = Cluster(
            network=network, postgres=postgres, database_url=url,
            base_url=f"http://127.0.0.1:{web_port}", logs=logs, runs_dir=home / "runs",
            env={
                **os.environ, **env, "DJANGO_SETTINGS_MODULE": "dashboard.settings",
                "TRAINYARD_HOME": str(home), "DATABASE_URL": url,
                "REDIS_URL": f"redis://{bridge}:{redis_port}/0",
                "TRAINYARD_DATA_DIR": str(data_dir), "TRAINYARD_NO_DOWNLOAD": "1",
                "TRAINYARD_RUNS_DIR": str(home / "runs"), "PYTHONUNBUFFERED": "1",
                "TRAINYARD_DEBUG": "1",
            },
        )  # fmt: skip
        cluster.services["redis"] = service_start(
            name="redis", command=redis, env=cluster.env, logs=logs
        )
        wait_for(lambda: port_open(redis_port), timeout=15, what="redis")
        try:
            cluster.manage("migrate", "--noinput", "-v", "0")
            for name, command in (
                ("web", daphne_command(port=web_port)),
                ("beat", [sys.executable, "-m", "celery", "-A", "dashboard", "beat", "--loglevel",
                          "INFO", "--schedule", str(home / "celerybeat-schedule")]),
            ):  # fmt: skip
                cluster.services[name] = service_start(
                    name=name, command=command, env=cluster.env, logs=logs
                )
            for machine in network.machines:
                cluster.worker_start(machine)
            wait_for(lambda: port_open(web_port), timeout=60, what="daphne")
            yield cluster
        finally:
            for service in reversed(list(cluster.services.values())):
                service.stop()
