"""The slow kinds are marked by what a test uses (tests/kinds.py), which `make test-fast` leaves
out, and every pytest process has a home and a test database of its own (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.netns import machines


@pytest.fixture
def stack() -> None:
    """Only the name of the stack's fixture: marking reads names, so nothing is started here."""


@pytest.fixture
def page() -> None:
    """Only the name of a browser page's fixture."""


def test_using_the_stack_is_marked_stack(request: pytest.FixtureRequest, stack: None) -> None:
    assert request.node.get_closest_marker("stack") is not None


def test_a_test_with_a_page_is_marked_browser(request: pytest.FixtureRequest, page: None) -> None:
    assert request.node.get_closest_marker("browser") is not None


def test_a_test_calling_into_netns_is_marked_machines(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("machines") is not None
    assert callable(machines)  # named, never called: no namespace is made


@pytest.mark.parametrize("page", ["list"])
def test_a_parameter_named_page_is_no_browser(request: pytest.FixtureRequest, page: str) -> None:
    node = request.node
    assert [node.get_closest_marker(k) for k in ("browser", "stack", "machines")] == [None] * 3


@pytest.mark.django_db
def test_the_test_database_and_home_are_this_process_own(
    tmp_path_factory: pytest.TempPathFactory, settings: Any
) -> None:
    from django.db import connection

    home = Path(os.environ["TRAINYARD_HOME"])
    assert home.is_relative_to(tmp_path_factory.getbasetemp())  # one per process and worker
    assert Path(settings.VAR_DIR) == home
    if connection.vendor == "sqlite":
        assert Path(connection.settings_dict["NAME"]) == home / "test.sqlite3"
