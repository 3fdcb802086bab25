"""The schema on PostgreSQL: the server the tests start themselves (tests/postgres.py) takes every
migration forwards and back, and the models need no migration there that SQLite would not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import need
from tests.postgres import Postgres, postgres_bin, postgres_running
from tests.stack import ROOT, free_port


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    need(postgres_bin() is not None, "PostgreSQL's server is not installed (package postgresql)")
    with postgres_running(port=free_port()) as server:
        yield server


def _manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": url, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"},
        timeout=300, check=False,
    )  # fmt: skip


def test_every_migration_applies_and_rolls_back_on_postgres(postgres: Postgres) -> None:
    url = postgres.database_create("trainyard_migrations")
    for args in (("migrate", "--noinput"), ("migrate", "experiments", "zero", "--noinput"),
                 ("migrate", "--noinput"), ("makemigrations", "--check", "--dry-run")):  # fmt: skip
        done = _manage(url, *args)
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stderr[-3000:]}"
    tables = _manage(url, "dbshell", "--", "-Atc", "select count(*) from experiments_experiment")
    assert tables.returncode == 0 and tables.stdout.strip() == "0", tables.stderr
