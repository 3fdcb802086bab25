"""PostgreSQL: the server the tests start themselves (tests/postgres.py) takes every migration
forwards and back, the models need no migration there that SQLite would not, and each pass of the
suite (tests/conftest.py's --database) really runs on its engine, in this process and in the
stack's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import on_postgres
from tests.postgres import Postgres
from tests.stack import ROOT, Stack


def _manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": url, "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
             "TRAINYARD_DEBUG": "1"},
        timeout=300, check=False,
    )  # fmt: skip


def test_every_migration_applies_and_rolls_back_on_postgres(postgres_server: Postgres) -> None:
    url = postgres_server.database_create("trainyard_migrations")
    for args in (("migrate", "--noinput"), ("migrate", "experiments", "zero", "--noinput"),
                 ("migrate", "--noinput"), ("makemigrations", "--check", "--dry-run")):  # fmt: skip
        done = _manage(url, *args)
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stderr[-3000:]}"
    tables = _manage(url, "dbshell", "--", "-Atc", "select count(*) from experiments_experiment")
    assert tables.returncode == 0 and tables.stdout.strip() == "0", tables.stderr


def _engine(request: pytest.FixtureRequest) -> str:
    return "postgresql" if on_postgres(request.config) else "sqlite"


@pytest.mark.django_db
def test_the_test_database_is_on_the_engine_of_the_pass(request: pytest.FixtureRequest) -> None:
    from django.db import connection

    assert connection.vendor == _engine(request)
    assert connection.settings_dict["NAME"].startswith(("test_", "/"))  # never a user's database


@pytest.mark.integration
def test_the_stacks_processes_share_the_engine_of_the_pass(
    request: pytest.FixtureRequest, stack: Stack
) -> None:
    printed = stack.manage(
        "shell", "-c", "from django.db import connection; print(connection.vendor)"
    )
    assert printed.strip().splitlines()[-1] == _engine(request)
    # The worker's device report reached the rows the test reads: the same database.
    assert ("test-worker",) in stack.query("SELECT hostname FROM devices_workermachine")


def test_connection_options_in_the_url_are_kept_beside_the_timeouts() -> None:
    from dashboard.settings import database_settings

    url = "postgres://u:p@db.example:5432/t?sslmode=require&sslrootcert=/etc/ca.pem"
    options = database_settings(url)["OPTIONS"]
    assert options["sslmode"] == "require" and options["sslrootcert"] == "/etc/ca.pem"
    assert options["tcp_user_timeout"] == 10000
    # The server's end of the session gets the same bounds (tests/test_netns.py cuts a client
    # off inside a transaction), beside what the URL's own options ask of the server.
    assert "-c tcp_keepalives_idle=10" in options["options"]
    url_options = database_settings(f"{url}&options=-c%20search_path%3Dlab")["OPTIONS"]["options"]
    assert url_options.endswith(" -c search_path=lab") and "tcp_user_timeout" in url_options


def test_the_servers_keepalives_can_be_left_to_a_pooler(monkeypatch: pytest.MonkeyPatch) -> None:
    from dashboard.settings import database_settings

    monkeypatch.setenv("TRAINYARD_POSTGRES_SERVER_KEEPALIVES", "0")
    options = database_settings("postgres://u:p@pooler:6432/t")["OPTIONS"]
    assert "options" not in options and options["tcp_user_timeout"] == 10000
